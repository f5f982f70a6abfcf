use super::{WMMA_MINIMUM_VERSION, WMMA_NAMESPACE};
use crate::{
    cuda::{
        CudaDialect,
        arch::CudaArchitecture,
        mma::{
            compile_manual_mma, compile_scaled_mma, supported_mma_combinations,
            supported_scaled_mma_combinations,
        },
    },
    shared::{
        Architecture, Dialect, DialectWmmaCompiler, Elem, Flags, Fragment, FragmentIdent,
        FragmentLayout,
        ManualMma, SupportedMmaCombinations, SupportedScaledMmaCombinations, Variable,
        WmmaInstruction, wmma_api_base,
    },
};
use cubecl_core::ir::{self as gpu, features::MmaConfig};
use itertools::Itertools;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CudaWmmaCompiler {}

/// LAB PATCH (LAB-PATCH.md): loads of bf16 16×16×16 operand fragments from shared memory in
/// the `.shared` state space. NVCC's bf16 `load_matrix_sync` addresses generically (`LD`, no
/// `LDSM`) where its f16 one takes `.shared` (`LDSM`). Host compilers of the same source
/// (lab's CPU emulation of CUDA) take wmma's own load.
const LAB_BF16_SHARED_LOADS: &str = r#"#ifndef LAB_BF16_SHARED_LOADS
#define LAB_BF16_SHARED_LOADS
namespace lab_wmma {
#ifdef __CUDA_ARCH__
#define LAB_WMMA_LOAD(USE, LAYOUT, PTX)                                                          \
    __device__ __forceinline__ void load_shared(                                                 \
        nvcuda::wmma::fragment<nvcuda::wmma::USE, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::LAYOUT>& f, \
        const __nv_bfloat16* p, unsigned ldm) {                                                  \
        unsigned* r = reinterpret_cast<unsigned*>(&f);                                           \
        unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(p));                        \
        asm volatile(PTX " {%0, %1, %2, %3}, [%4], %5;\n"                                        \
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                            \
                     : "r"(at), "r"(ldm)                                                         \
                     : "memory");                                                                \
    }
LAB_WMMA_LOAD(matrix_a, row_major, "wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16")
LAB_WMMA_LOAD(matrix_a, col_major, "wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16")
LAB_WMMA_LOAD(matrix_b, row_major, "wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16")
LAB_WMMA_LOAD(matrix_b, col_major, "wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16")
#undef LAB_WMMA_LOAD
#else
template <class Fragment, class Pointer>
void load_shared(Fragment& f, Pointer p, unsigned ldm) {
    nvcuda::wmma::load_matrix_sync(f, p, ldm);
}
#endif
}  // namespace lab_wmma
#endif
"#;

/// LAB PATCH: `lab_wmma::load_shared(…)` for a load of a bf16 16×16×16 `A` or `B` fragment
/// from a shared array ([`LAB_BF16_SHARED_LOADS`]); `None` for any other instruction.
fn lab_bf16_shared_load<D: Dialect>(instruction: &WmmaInstruction<D>) -> Option<String> {
    let WmmaInstruction::Load {
        frag,
        value,
        offset,
        stride,
        layout: None,
    } = instruction
    else {
        return None;
    };
    let Variable::WmmaFragment { frag: fragment, .. } = frag else {
        return None;
    };
    let operand = matches!(fragment.ident, FragmentIdent::A | FragmentIdent::B);
    let shape = (fragment.m, fragment.n, fragment.k) == (16, 16, 16);
    let bf16 = matches!(fragment.elem, Elem::BF16);
    let shared = match value {
        Variable::SharedArray(_, item, _) | Variable::Shared(_, item) => item.vectorization == 1,
        _ => false,
    };
    (operand && shape && bf16 && shared)
        .then(|| format!("lab_wmma::load_shared({frag}, {value} + {offset}, {stride});\n"))
}

impl DialectWmmaCompiler<CudaDialect<Self>> for CudaWmmaCompiler {
    fn compile_wmma_includes(
        f: &mut std::fmt::Formatter<'_>,
        _flags: &Flags<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        f.write_str("#include <mma.h>\n")?;
        f.write_str(LAB_BF16_SHARED_LOADS)
    }

    fn compile_wmma_fragment_declaration(
        f: &mut std::fmt::Formatter<'_>,
        var: &crate::shared::Variable<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        wmma_api_base::compile_fragment_declaration(f, var)
    }

    fn compile_wwma_fragment_ident(
        f: &mut std::fmt::Formatter<'_>,
        ident: &FragmentIdent<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        wmma_api_base::compile_fragment_ident(f, WMMA_NAMESPACE, ident)
    }

    fn compile_wmma_fragment_layout(
        f: &mut std::fmt::Formatter<'_>,
        layout: &FragmentLayout<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        wmma_api_base::compile_fragment_layout(f, WMMA_NAMESPACE, layout)
    }

    fn compile_wmma_fragment(
        f: &mut std::fmt::Formatter<'_>,
        fragment: &Fragment<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        wmma_api_base::compile_fragment(f, WMMA_NAMESPACE, fragment)
    }

    fn compile_wmma_instruction(
        f: &mut std::fmt::Formatter<'_>,
        instruction: &WmmaInstruction<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        if let Some(load) = lab_bf16_shared_load(instruction) {
            return f.write_str(&load);
        }
        wmma_api_base::compile_instruction(f, WMMA_NAMESPACE, instruction)
    }

    fn compile_manual_mma(
        f: &mut std::fmt::Formatter<'_>,
        mma: ManualMma<CudaDialect<Self>>,
    ) -> std::fmt::Result {
        compile_manual_mma(f, mma)
    }

    fn compile_scaled_mma(
        f: &mut std::fmt::Formatter<'_>,
        mma: ManualMma<CudaDialect<Self>>,
        scales_a: Variable<CudaDialect<Self>>,
        scales_b: Variable<CudaDialect<Self>>,
        scales_factor: u32,
    ) -> std::fmt::Result {
        compile_scaled_mma(f, mma, scales_a, scales_b, scales_factor)
    }

    fn supported_wmma_combinations(arch: &CudaArchitecture) -> SupportedMmaCombinations {
        let mut result: SupportedMmaCombinations = vec![];
        if arch.get_version() >= WMMA_MINIMUM_VERSION {
            let tdims = vec![(16, 16, 16), (32, 8, 16), (8, 32, 16)];
            // Types fully supported.
            let types = vec![
                (
                    gpu::ElemType::Float(gpu::FloatKind::F16), // m
                    gpu::ElemType::Float(gpu::FloatKind::F16), // n
                    gpu::ElemType::Float(gpu::FloatKind::F16), // k
                ),
                (
                    gpu::ElemType::Float(gpu::FloatKind::F16),
                    gpu::ElemType::Float(gpu::FloatKind::F16),
                    gpu::ElemType::Float(gpu::FloatKind::F32),
                ),
                (
                    gpu::ElemType::Float(gpu::FloatKind::BF16),
                    gpu::ElemType::Float(gpu::FloatKind::BF16),
                    gpu::ElemType::Float(gpu::FloatKind::F32),
                ),
                (
                    gpu::ElemType::Int(gpu::IntKind::I8),
                    gpu::ElemType::Int(gpu::IntKind::I8),
                    gpu::ElemType::Int(gpu::IntKind::I32),
                ),
                (
                    gpu::ElemType::UInt(gpu::UIntKind::U8),
                    gpu::ElemType::UInt(gpu::UIntKind::U8),
                    gpu::ElemType::Int(gpu::IntKind::I32),
                ),
            ];
            let combinations: SupportedMmaCombinations = types
                .into_iter()
                .cartesian_product(tdims)
                .map(|((a, b, c), (m, n, k))| MmaConfig {
                    a_type: a.into(),
                    b_type: b.into(),
                    cd_type: c.into(),
                    m,
                    n,
                    k,
                })
                .collect();
            result.extend(combinations);
            if arch.get_version() >= 80 {
                result.push(MmaConfig {
                    a_type: gpu::ElemType::Float(gpu::FloatKind::TF32).into(),
                    b_type: gpu::ElemType::Float(gpu::FloatKind::TF32).into(),
                    cd_type: gpu::ElemType::Float(gpu::FloatKind::F32).into(),
                    m: 16,
                    n: 16,
                    k: 8,
                });
            }
        }
        result
    }

    fn supported_mma_combinations(arch: &CudaArchitecture) -> SupportedMmaCombinations {
        supported_mma_combinations(arch)
    }

    fn supported_scaled_mma_combinations(
        arch: &CudaArchitecture,
    ) -> SupportedScaledMmaCombinations {
        supported_scaled_mma_combinations(arch)
    }
}
