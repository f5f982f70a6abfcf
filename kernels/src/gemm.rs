//! Matrix products on a vendor BLAS where one beats cubecl's matmul: cuBLASLt on CUDA.
//!
//! On an H100, cubecl's matmul reached 0.15–0.23× of cuBLAS on x1-50m's projections
//! (BENCHMARKS.md, "First figures on an H100"). [`VendorMatmul::vendor_matmul`] hands such a
//! product to the vendor's library on the tensors' own device memory; lab-ops' projection op
//! calls it, forward and backward, for the blocks' projections and the LM-head loss's three
//! products, behind [`Choice`] (`LAB_MATMUL`), off by default until a GPU session has
//! measured it.
//!
//! A BLAS is column-major. A row-major `[r, c]` matrix with row stride `ld` is, read
//! column-major, its transpose `[c, r]` with leading dimension `ld`; a transposed view
//! (columns contiguous) is the matrix itself. So `C = A·B` (row-major, `[M, N]`) is computed
//! as `Cᵀ = Bᵀ·Aᵀ` column-major, and [`plan`] says for each operand which op (N or T) and
//! leading dimension the library needs. The plan is host arithmetic, tested here against a
//! reading of the buffers with a BLAS's own rules, on every build.

#[cfg(feature = "cuda")]
mod cublaslt;
#[cfg(feature = "cube")]
mod vendor;

#[cfg(feature = "cube")]
pub use vendor::{counted_vendor_matmul, vendor_counts, VendorCounts, VendorMatmul};

/// Whether the vendor BLAS's library loads on this machine: libcublasLt with CUDA.
#[cfg(feature = "cuda")]
pub fn vendor_library_present() -> bool {
    cublaslt::library_present()
}

/// How the column-major call reads one operand's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Whether the call transposes the storage (op T) or reads it as it is (op N).
    pub transpose: bool,
    /// The storage's leading dimension, in elements.
    pub ld: usize,
}

/// The column-major call `D[m×n] = op(X)[m×k] · op(Y)[k×n]`, `D` with leading dimension
/// `m`, that computes the row-major `C[M, N] = A[M, K] · B[K, N]` into a contiguous `C`:
/// `m = N`, `n = M`, `k = K`, `X` is `B`'s storage and `Y` is `A`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub x: Operand,
    pub y: Operand,
}

/// The call for `a [M, K] · b [K, N]` given in element strides, or `None` where an operand is
/// neither row- nor column-contiguous (a broadcast, a strided slice) or a dimension is zero:
/// the caller then uses the backend's own matmul.
pub fn plan(
    a_shape: [usize; 2],
    a_strides: [usize; 2],
    b_shape: [usize; 2],
    b_strides: [usize; 2],
) -> Option<Plan> {
    let ([m_rows, k], [k_b, n]) = (a_shape, b_shape);
    assert_eq!(k, k_b, "matmul: inner dimensions {k} and {k_b} differ");
    if [m_rows, k, n].contains(&0) {
        return None;
    }
    Some(Plan {
        m: n,
        n: m_rows,
        k,
        x: transposed_operand(b_shape, b_strides)?,
        y: transposed_operand(a_shape, a_strides)?,
    })
}

/// How a column-major call reads `Lᵀ` from the storage of the row-major `L [r, c]`.
fn transposed_operand([r, c]: [usize; 2], [row_stride, col_stride]: [usize; 2]) -> Option<Operand> {
    // Rows contiguous: the storage read column-major is Lᵀ [c × r] already (op N).
    if (col_stride == 1 || c == 1) && (r == 1 || row_stride >= c) {
        let ld = if r == 1 { c } else { row_stride };
        return Some(Operand {
            transpose: false,
            ld,
        });
    }
    // Columns contiguous (a transposed view): the storage is L [r × c] (op T).
    if (row_stride == 1 || r == 1) && (c == 1 || col_stride >= r) {
        let ld = if c == 1 { r } else { col_stride };
        return Some(Operand {
            transpose: true,
            ld,
        });
    }
    None
}

/// What the projections' products (and the GPU LM-head loss's) run on: `LAB_MATMUL`, read
/// once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The backend's own matmul under burn's own autodiff node (the default).
    Backend,
    /// lab's projection op (its autodiff node, its Fusion custom op) around the backend's
    /// matmul: the seam without the vendor library, to test it on any device and to time
    /// what the seam alone costs (`LAB_MATMUL=op`).
    Op,
    /// lab's projection op on the vendor's BLAS where the runtime has one: cuBLASLt on CUDA,
    /// for f16 and bf16 (`LAB_MATMUL=cublaslt`). Elsewhere the same as `Op`.
    Vendor,
}

static CHOICE: std::sync::OnceLock<Choice> = std::sync::OnceLock::new();

impl Choice {
    /// The value of `LAB_MATMUL` (`backend`, unset or empty: the default; `op`; `cublaslt`).
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "" | "backend" => Ok(Self::Backend),
            "op" => Ok(Self::Op),
            "cublaslt" => Ok(Self::Vendor),
            other => Err(format!(
                "LAB_MATMUL={other:?}: expected backend, op or cublaslt (unset it for the default)"
            )),
        }
    }

    /// This process's choice: the one [`Choice::set`] made, else `LAB_MATMUL`'s, else
    /// [`Choice::Backend`]. An unknown value counts as the default here; the trainer checks
    /// it first with [`Choice::from_env`] and stops with its error.
    pub fn current() -> Self {
        *CHOICE.get_or_init(|| Self::from_env().unwrap_or(Self::Backend))
    }

    /// `LAB_MATMUL`'s choice, or the one-line error naming the variable and its values.
    pub fn from_env() -> Result<Self, String> {
        Self::parse(&std::env::var("LAB_MATMUL").unwrap_or_default())
    }

    /// Fixes this process's choice before the first product reads it (tests, benches);
    /// `Err` with the choice already in force if one is.
    pub fn set(self) -> Result<(), Self> {
        CHOICE.set(self).map_err(|_| Self::current())
    }

    /// Whether the projections go through lab's op rather than the backend's matmul node.
    pub fn uses_op(self) -> bool {
        self != Self::Backend
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `op(X)[i, l]` as a column-major BLAS reads it.
    fn read(storage: &[f64], op: Operand, i: usize, l: usize) -> f64 {
        if op.transpose {
            storage[l + i * op.ld]
        } else {
            storage[i + l * op.ld]
        }
    }

    /// `D` of the call, column-major with leading dimension `m`, by a BLAS's rules, which
    /// also refuse a leading dimension below the stored matrix's rows.
    fn blas(p: &Plan, x: &[f64], y: &[f64]) -> Vec<f64> {
        let stored_rows = |op: Operand, (rows, cols): (usize, usize)| {
            if op.transpose {
                cols
            } else {
                rows
            }
        };
        assert!(
            p.x.ld >= stored_rows(p.x, (p.m, p.k)).max(1),
            "X's ld: {p:?}"
        );
        assert!(
            p.y.ld >= stored_rows(p.y, (p.k, p.n)).max(1),
            "Y's ld: {p:?}"
        );
        let mut d = vec![f64::NAN; p.m * p.n];
        for j in 0..p.n {
            for i in 0..p.m {
                d[i + j * p.m] = (0..p.k)
                    .map(|l| read(x, p.x, i, l) * read(y, p.y, l, j))
                    .sum();
            }
        }
        d
    }

    /// A `[r, c]` matrix stored row-major with row stride `r_pad ≥ c`, or (`transposed`) as
    /// the transposed view of a `[c, r]` row-major matrix with row stride `pad ≥ r`; the
    /// values `f(i, j)`, every other element of the storage NaN (a read of one shows).
    fn stored(
        [r, c]: [usize; 2],
        transposed: bool,
        pad: usize,
        f: impl Fn(usize, usize) -> f64,
    ) -> (Vec<f64>, [usize; 2]) {
        let (outer, inner) = if transposed { (c, r) } else { (r, c) };
        let stride = inner + pad;
        let mut data = vec![f64::NAN; outer * stride];
        for i in 0..r {
            for j in 0..c {
                let at = if transposed {
                    j * stride + i
                } else {
                    i * stride + j
                };
                data[at] = f(i, j);
            }
        }
        let strides = if transposed { [1, stride] } else { [stride, 1] };
        (data, strides)
    }

    fn a_value(i: usize, l: usize) -> f64 {
        (i * 7 + l * 3) as f64 % 11.0 - 5.0
    }

    fn b_value(l: usize, j: usize) -> f64 {
        (l * 5 + j * 2) as f64 % 13.0 - 6.0
    }

    /// The plan's call on the stored operands gives `A·B`, row-major and contiguous.
    fn check(m: usize, k: usize, n: usize, a_t: bool, b_t: bool, a_pad: usize, b_pad: usize) {
        let (a, a_strides) = stored([m, k], a_t, a_pad, a_value);
        let (b, b_strides) = stored([k, n], b_t, b_pad, b_value);
        let p = plan([m, k], a_strides, [k, n], b_strides).expect("a BLAS reads both");
        let c = blas(&p, &b, &a);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|l| a_value(i, l) * b_value(l, j)).sum();
                assert_eq!(c[i * n + j], want, "C[{i}, {j}] of {m}x{k}x{n}, {p:?}");
            }
        }
    }

    #[test]
    fn row_major_operands_are_read_as_they_are() {
        check(3, 4, 5, false, false, 0, 0);
        let p = plan([3, 4], [4, 1], [4, 5], [5, 1]).unwrap();
        let n = |ld| Operand {
            transpose: false,
            ld,
        };
        assert_eq!(
            p,
            Plan {
                m: 5,
                n: 3,
                k: 4,
                x: n(5),
                y: n(4)
            }
        );
    }

    #[test]
    fn transposed_views_are_read_with_op_t() {
        // The projection's backward: dX = dY·Wᵀ and dW = Xᵀ·dY, transposes as views.
        check(6, 3, 4, false, true, 0, 0);
        check(6, 3, 4, true, false, 0, 0);
        let p = plan([6, 3], [1, 6], [3, 4], [4, 1]).unwrap();
        assert_eq!(
            p.y,
            Operand {
                transpose: true,
                ld: 6
            }
        );
    }

    #[test]
    fn padded_rows_keep_their_stride() {
        // cubecl pads a matmul's output rows on CUDA: its row stride is not its width.
        check(5, 7, 3, false, false, 9, 2);
        check(5, 7, 3, true, true, 1, 3);
    }

    #[test]
    fn vectors_and_single_elements() {
        for (m, k, n) in [(1, 1, 1), (1, 5, 1), (4, 1, 3), (1, 3, 6), (6, 3, 1)] {
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                check(m, k, n, a_t, b_t, 0, 0);
            }
        }
    }

    #[test]
    fn broadcasts_strided_slices_and_empty_products_are_left_to_the_backend() {
        assert_eq!(
            plan([3, 4], [0, 1], [4, 5], [5, 1]),
            None,
            "a broadcast row"
        );
        assert_eq!(
            plan([3, 4], [8, 2], [4, 5], [5, 1]),
            None,
            "every other column"
        );
        assert_eq!(
            plan([3, 4], [2, 1], [4, 5], [5, 1]),
            None,
            "overlapping rows"
        );
        assert_eq!(plan([0, 4], [4, 1], [4, 5], [5, 1]), None, "no rows");
        assert_eq!(
            plan([3, 0], [0, 1], [0, 5], [5, 1]),
            None,
            "no inner dimension"
        );
    }

    #[test]
    fn lab_matmul_values() {
        assert_eq!(Choice::parse(""), Ok(Choice::Backend));
        assert_eq!(Choice::parse("backend"), Ok(Choice::Backend));
        assert_eq!(Choice::parse("op"), Ok(Choice::Op));
        assert_eq!(Choice::parse("cublaslt"), Ok(Choice::Vendor));
        let err = Choice::parse("cublas").unwrap_err();
        assert!(
            err.contains("LAB_MATMUL") && err.contains("cublaslt"),
            "{err}"
        );
        assert!(!Choice::Backend.uses_op() && Choice::Op.uses_op() && Choice::Vendor.uses_op());
    }

    proptest! {
        #[test]
        fn any_blas_readable_layout_multiplies_right(
            m in 1usize..7, k in 1usize..7, n in 1usize..7,
            a_t: bool, b_t: bool, a_pad in 0usize..3, b_pad in 0usize..3,
        ) {
            check(m, k, n, a_t, b_t, a_pad, b_pad);
        }
    }
}
