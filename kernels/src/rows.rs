//! One cube per row of a matrix: the grid and each cube's row, shared by the row-wise kernels
//! (the LM-head loss's, RMSNorm's).

use cubecl::prelude::*;

/// Cubes per grid axis: wgpu caps each at 65,535, so rows spill onto the y axis.
pub const MAX_GRID: usize = 65_535;

/// The row a cube owns (rows are spread over the grid's x and y axes).
#[cube]
pub fn cube_row() -> usize {
    CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize
}

/// A grid of one cube per row.
pub fn row_grid(rows: usize) -> CubeCount {
    let x = rows.clamp(1, MAX_GRID);
    CubeCount::Static(x as u32, rows.div_ceil(x) as u32, 1)
}
