//! Rows read and written several elements an access, as wide as the device loads at once
//! (16 bytes: 8 bf16 or f16, 4 f32 on CUDA; lavapipe takes up to 4 elements).
//!
//! An element-wise kernel that moves one 2-byte element a unit keeps few bytes in flight
//! an SM, which bounds its share of the GPU's memory bandwidth well below the peak; a 16-byte
//! access moves eight times as much per instruction, as llm.c's packed `x128` loads do. A
//! kernel takes a vector of `N` elements of a row a unit where every tensor it touches allows
//! it, and one element (`N = 1`, at any strides) otherwise.

use burn_cubecl::{tensor::CubeTensor, CubeRuntime};

/// The widest vector, in elements, that the device loads in one access (of the widest elements
/// among the tensors: no access past 16 bytes on CUDA) and in which every one of `tensors` can be
/// read along its rows, `columns` at a time being whole vectors (a kernel's step along a row: its
/// width, or the offset of a second half it reads). 1 where none is wider.
pub fn row_vector_size<R: CubeRuntime>(tensors: &[&CubeTensor<R>], columns: usize) -> usize {
    widest(tensors, |layout, size| layout.in_vectors(size, columns))
}

/// The widest vector, as [`row_vector_size`], in which the matrices `tensors` can be read along
/// their rows with every row's last vector whole: a row of `columns` is read to the next multiple
/// of the vector, into the padding its stride leaves after it (the LM head's logits: 50,257 columns
/// of rows at least 50,304 apart, 50,432 where CUDA pitches them). The kernel leaves the lanes past
/// `columns` out, and writes them back as they were.
pub fn padded_row_vector_size<R: CubeRuntime>(tensors: &[&CubeTensor<R>], columns: usize) -> usize {
    widest(tensors, |layout, size| {
        layout.padded_in_vectors(size, columns)
    })
}

/// The widest of the device's sizes for the widest elements among `tensors` whose layouts all
/// `fit` it; 1 where none is wider.
fn widest<R: CubeRuntime>(
    tensors: &[&CubeTensor<R>],
    fits: impl Fn(&RowLayout, usize) -> bool,
) -> usize {
    let Some(first) = tensors.first() else {
        return 1;
    };
    let layouts: Vec<RowLayout> = tensors.iter().map(|t| RowLayout::of(t)).collect();
    let widest_elements = tensors.iter().map(|t| t.dtype.size()).max().unwrap_or(1);
    let sizes = first.client.io_optimized_vector_sizes(widest_elements);
    sizes
        .filter(|&size| layouts.iter().all(|layout| fits(layout, size)))
        .max()
        .unwrap_or(1)
}

/// Where a tensor's elements lie in its buffer: what decides whether its rows can be read a
/// vector an access.
#[derive(Clone, Copy, Debug)]
pub struct RowLayout<'a> {
    /// Where the tensor starts in its buffer.
    pub start_bytes: u64,
    /// In elements, the rows' (the last axis') last.
    pub strides: &'a [usize],
    pub elem_bytes: usize,
}

impl<'a> RowLayout<'a> {
    pub fn of<R: CubeRuntime>(t: &'a CubeTensor<R>) -> Self {
        Self {
            start_bytes: t.handle.offset_start.unwrap_or(0),
            strides: t.meta.strides(),
            elem_bytes: t.dtype.size(),
        }
    }

    /// Whether the rows can be read `size` elements an access, `columns` at a time: rows of
    /// unit stride, every other stride and the start whole vectors, so that every vector lies
    /// in one row and starts on a multiple of its own size in bytes.
    pub fn in_vectors(&self, size: usize, columns: usize) -> bool {
        let Some((&row_stride, outer)) = self.strides.split_last() else {
            return size == 1;
        };
        size == 1
            || (row_stride == 1
                && columns.is_multiple_of(size)
                && outer.iter().all(|s| s.is_multiple_of(size))
                && self
                    .start_bytes
                    .is_multiple_of((size * self.elem_bytes) as u64))
    }

    /// [`Self::in_vectors`] for a matrix whose rows of `columns` are read to the next multiple
    /// of `size`: those vectors must end within the row's stride.
    pub fn padded_in_vectors(&self, size: usize, columns: usize) -> bool {
        size == 1
            || (self.strides.len() == 2
                && self.in_vectors(size, size)
                && columns.next_multiple_of(size) <= self.strides[0])
    }
}

#[cfg(test)]
mod tests {
    use super::RowLayout;

    /// The layout of a tensor `start_bytes` into its buffer at `strides`, of `elem_bytes`.
    fn at(start_bytes: u64, strides: &[usize], elem_bytes: usize) -> RowLayout<'_> {
        RowLayout {
            start_bytes,
            strides,
            elem_bytes,
        }
    }

    #[test]
    fn one_element_an_access_takes_any_layout() {
        assert!(at(2, &[1, 7], 2).in_vectors(1, 5));
        assert!(at(0, &[], 4).in_vectors(1, 0));
    }

    #[test]
    fn contiguous_rows_of_whole_vectors_take_the_vector() {
        // bf16 [N, 2048]: 8 a vector; and the same rows 64 columns into their buffer.
        assert!(at(0, &[2048, 1], 2).in_vectors(8, 2048));
        assert!(at(128, &[2048, 1], 2).in_vectors(8, 2048));
    }

    #[test]
    fn a_layout_that_splits_a_vector_takes_one_element() {
        // Rows with strided columns (a transposed matrix).
        assert!(!at(0, &[1, 64], 4).in_vectors(4, 64));
        // A width that is not whole vectors, or rows a part of a vector apart.
        assert!(!at(0, &[2048, 1], 2).in_vectors(8, 2044));
        assert!(!at(0, &[102, 1], 4).in_vectors(4, 100));
        // A start half a vector in.
        assert!(!at(8, &[2048, 1], 2).in_vectors(8, 2048));
        // Smaller vectors may still fit where the widest does not.
        assert!(at(8, &[102, 1], 4).in_vectors(2, 100));
    }

    #[test]
    fn padded_rows_take_vectors_that_end_within_their_stride() {
        // GPT-2's 50,257 logits of rows padded to 50,304, bf16: 8 a vector, the last one
        // reaching column 50,263.
        assert!(at(0, &[50304, 1], 2).padded_in_vectors(8, 50257));
        // Contiguous rows of 50,257: the last vector would run into the next row.
        assert!(!at(0, &[50257, 1], 2).padded_in_vectors(8, 50257));
        assert!(!at(0, &[7, 1], 2).padded_in_vectors(2, 7));
        // Rows that are whole vectors need no padding.
        assert!(at(0, &[64, 1], 4).padded_in_vectors(4, 64));
        // Strided columns, a misaligned start, or not a matrix: one element.
        assert!(!at(0, &[1, 50304], 2).padded_in_vectors(8, 50257));
        assert!(!at(2, &[50304, 1], 2).padded_in_vectors(8, 50257));
        assert!(!at(0, &[64], 4).padded_in_vectors(4, 64));
        assert!(at(2, &[1, 7], 2).padded_in_vectors(1, 7));
    }
}
