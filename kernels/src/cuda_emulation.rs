//! cubecl's CUDA C++ run on a CPU emulation of the CUDA it uses (`kernels/cuda-emu`:
//! threads, barriers, warp shuffles, wmma tiles, a race detector on shared and global memory),
//! built with the host's C++ compiler (`$CXX`, default `c++`) together with a driver that
//! launches the kernels and checks them against an fp64 reference: `attention.cpp` for the
//! attention's kernels (`attention::cuda_source`), `rows.cpp` for the kernels that read 16-byte
//! vectors (`cuda_source`: 8 bf16 a vector, a width lavapipe does not take), `step.cpp` for
//! the optimizer step's and the embedding's.

use burn::tensor::DType;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The emulation's sources: `include/emu.h` (CUDA on fibers) and the drivers.
fn emulation_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda-emu")
}

/// `cpp` as the driver includes it: its `info_st` and its entry named after `kernel`
/// (`info_grad_q`, `grad_q_kernel`: the kernels share one translation unit, and the two
/// `dK/dV` launches of wide heads are one kernel), its shared arrays as the emulation's
/// (`emu::Shared`, whose writes other threads see only after a barrier) at the same offsets,
/// and its tensor parameters as `emu::Global` (whose accesses are checked between blocks and
/// between a block's threads).
fn for_emulation(cpp: &str, kernel: &str) -> String {
    let info = format!("info_{kernel}");
    let lines = without_register_products(cpp)
        .into_iter()
        .filter(|line| !line.starts_with("extern __shared__"))
        .map(|line| {
            shared_array(line)
                .or_else(|| entry_renamed(line, kernel))
                .or_else(|| shared_recast(line))
                .or_else(|| global_parameters(line))
                .unwrap_or_else(|| line.to_string())
                .replace("info_st", &info)
        });
    let source = vector_types_once(lines).join("\n");
    // A parameter line in a shape global_parameters does not know would leave its tensors raw
    // pointers, which build and run without the checks of global memory.
    let raw = source.lines().find(|line| declares_tensor(line));
    assert!(
        raw.is_none(),
        "{kernel}: a tensor parameter not wrapped as emu::Global: {raw:?}"
    );
    source
}

/// `cpp`'s lines less cubecl's inline-PTX definitions of `ldmatrix` and `mma.sync`
/// (`inline __device__ void` on the line before `__ldmatrix_…(` or `__mma_m16n8k…(`, to the
/// line `}`): the emulation defines them (include/emu.h).
fn without_register_products(cpp: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut in_definition = false;
    for line in cpp.lines() {
        if in_definition {
            in_definition = line.trim() != "}";
            continue;
        }
        let defines = line.starts_with("__ldmatrix_") || line.starts_with("__mma_m16n8k");
        if defines && line.ends_with('{') && out.last() == Some(&"inline __device__ void") {
            out.pop();
            in_definition = true;
            continue;
        }
        out.push(line);
    }
    out
}

/// The vector types cubecl defines in every kernel's source (`struct __align__(16)
/// __nv_bfloat16_8 {` to `};`) guarded, so that the kernels can share the driver's translation
/// unit.
fn vector_types_once(lines: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_type = false;
    for line in lines {
        if let Some(name) = line
            .strip_prefix("struct __align__(")
            .and_then(|rest| rest.split_once(") "))
            .and_then(|(_, rest)| rest.strip_suffix(" {"))
        {
            out.push(format!("#ifndef LAB_EMU_{name}\n#define LAB_EMU_{name}"));
            in_type = true;
        }
        let ends_type = in_type && line == "};";
        out.push(line);
        if ends_type {
            out.push("#endif".into());
            in_type = false;
        }
    }
    out
}

/// Whether `line` declares a tensor parameter as a pointer (`T* buffer_N`, `T* __restrict__
/// buffer_N`), as cubecl writes them.
fn declares_tensor(line: &str) -> bool {
    line.contains("* buffer_") || line.contains("* __restrict__ buffer_")
}

/// A line of parameters with tensors (`const T* __restrict__ buffer_N, T* buffer_M, …`) with
/// each tensor as `emu::Global<const T> buffer_N`; `None` for a line without them.
fn global_parameters(line: &str) -> Option<String> {
    if !declares_tensor(line) {
        return None;
    }
    let indent = &line[..line.len() - line.trim_start().len()];
    let parameters: Vec<String> = line
        .trim_start()
        .split(", ")
        .map(|parameter| {
            let tensor = parameter
                .split_once("* ")
                .map(|(ty, name)| (ty, name.trim_start_matches("__restrict__ ")))
                .filter(|(_, name)| name.starts_with("buffer_"));
            match tensor {
                Some((ty, name)) => format!("emu::Global<{ty}> {name}"),
                None => parameter.to_string(),
            }
        })
        .collect();
    Some(format!("{indent}{}", parameters.join(", ")))
}

/// ` T *_tmp_N = reinterpret_cast< T*>(shared_memory_M);` (a vector access to a shared array)
/// as `emu::Shared<T> _tmp_N = emu::recast<T>(shared_memory_M);`; `None` for any other line.
fn shared_recast(line: &str) -> Option<String> {
    let (ty, rest) = line.trim_start().split_once(" *_tmp_")?;
    let (number, rest) = rest.split_once(" = reinterpret_cast<")?;
    let array = rest.split_once(">(shared_memory_")?.1.strip_suffix(");")?;
    Some(format!(
        "emu::Shared<{ty}> _tmp_{number} = emu::recast<{ty}>(shared_memory_{array});"
    ))
}

/// The entry's first line, `extern "C" __global__ void … NAME (`, with `NAME` (what follows
/// the last `)` or space before ` (`) as `{kernel}_kernel`; `None` for any other line. (A line
/// in another shape leaves the name, and the driver's build fails on the missing entry.)
fn entry_renamed(line: &str, kernel: &str) -> Option<String> {
    if !line.starts_with("extern \"C\" __global__") {
        return None;
    }
    let head = line.strip_suffix(" (")?;
    let name_at = head.rfind([')', ' '])? + 1;
    Some(format!("{}{kernel}_kernel (", &head[..name_at]))
}

/// `T *shared_memory_N = reinterpret_cast<T*>(&dynamic_shared_mem[OFFSET]);` as
/// `emu::Shared<T> shared_memory_N{OFFSET};`; `None` for any other line.
fn shared_array(line: &str) -> Option<String> {
    let (ty, rest) = line.split_once(" *shared_memory_")?;
    let (number, rest) = rest.split_once(" = reinterpret_cast<")?;
    let offset = rest
        .split_once("&dynamic_shared_mem[")?
        .1
        .split_once(']')?
        .0;
    Some(format!(
        "emu::Shared<{ty}> shared_memory_{number}{{{offset}}};"
    ))
}

/// One build of a driver: a set of kernels (`kernels`: name and CUDA C++, each written into
/// the build's folder as `NAME.cu`) at one storage type, in a folder of its own.
pub(crate) struct Emulation {
    /// The driver in `kernels/cuda-emu` that includes the kernels, launches and checks them.
    pub driver: &'static str,
    pub kernels: Vec<(&'static str, String)>,
    /// The storage type, as C++ names it (`-DSTORAGE`) and as the reports do (`-DSUFFIX`).
    pub storage: &'static str,
    pub suffix: &'static str,
    /// What else tells this build apart in messages and folder names (`hd 64`).
    pub label: String,
    /// How the driver launches them, as `-D` definitions.
    pub defines: Vec<String>,
}

/// Seconds an emulation may run before it counts as hung (a loop that never ends: a barrier
/// or shuffle that some threads never reach ends the run at once, exit 124). A hang is a bug,
/// slowness is not, so this is far above the slowest seen (~10 s, on a core of 2).
const EMULATION_LIMIT_S: u32 = 600;

/// The storage types the kernels are emulated at: (suffix, C++ type, dtype).
pub(crate) const STORAGES: [(&str, &str, DType); 2] = [
    ("f16", "__half", DType::F16),
    ("bf16", "__nv_bfloat16", DType::BF16),
];

/// `-DNAME=value` for each of lab's launch constants a driver takes.
pub(crate) fn defines<'a>(constants: impl IntoIterator<Item = (&'a str, usize)>) -> Vec<String> {
    constants
        .into_iter()
        .map(|(name, value)| format!("-D{name}={value}"))
        .collect()
}

/// Builds `driver` (in `kernels/cuda-emu`) into `binary` with the kernels in `dir` on the include
/// path. At -Og: a build and run take less than at -O1 (hd 64's tensor-core kernels: 3.8 s and
/// 3.0 s, against 6.9 s and 2.3 s; BENCHMARKS, "The CUDA emulation on fibers").
fn build<'a>(
    driver: &str,
    dir: &Path,
    defines: impl Iterator<Item = &'a String>,
    binary: &Path,
    what: &str,
) {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let emu = emulation_dir();
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-Og", "-w"])
        .arg(format!("-I{}", emu.join("include").display()))
        .arg(format!("-I{}", dir.display()))
        .args(defines)
        .arg(emu.join(driver))
        .arg("-o")
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e} (a C++20 compiler is needed; set CXX)"));
    assert!(
        built.status.success(),
        "{cxx} failed on the {what} emulation:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

impl Emulation {
    /// Writes the kernels into `dir`, builds the driver there and runs it; its output.
    fn run(&self, dir: &Path) -> String {
        std::fs::create_dir_all(dir).expect("a temporary folder");
        for (kernel, cpp) in &self.kernels {
            std::fs::write(dir.join(format!("{kernel}.cu")), for_emulation(cpp, kernel))
                .expect("a temporary file");
        }
        let what = format!("{} {} {}", self.driver, self.suffix, self.label);
        let binary = dir.join("driver");
        let defines = [
            format!("-DSTORAGE={}", self.storage),
            format!("-DSUFFIX={}", self.suffix),
        ];
        build(
            self.driver,
            dir,
            defines.iter().chain(&self.defines),
            &binary,
            &what,
        );
        // A shuffle or barrier that some thread never reaches ends the emulation with exit 124,
        // as coreutils' `timeout` does a loop that never ends (instead of a stuck test run).
        let run = Command::new("timeout")
            .arg(EMULATION_LIMIT_S.to_string())
            .arg(&binary)
            .output()
            .expect("the emulation runs (under coreutils' timeout)");
        let report = String::from_utf8_lossy(&run.stdout).into_owned();
        assert!(
            run.status.code() != Some(124),
            "{what}: the emulation hung (at a warp shuffle or barrier that not every thread \
             reaches, called in a branch that differs between rows?, or for \
             {EMULATION_LIMIT_S} s):\n{report}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(
            run.status.success(),
            "{what}: off the fp64 reference or a race (shared or global memory):\n{report}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        // Kernels compiled in `Validate` mode print each access past the end of a tensor
        // (cubecl's `[VALIDATION kernel]: Encountered OOB …`), which `launch_unchecked`
        // would not catch.
        assert!(
            !report.contains("Encountered OOB"),
            "{what}: an access out of bounds:\n{report}"
        );
        report
    }
}

/// Runs every emulation, one thread apiece (each a C++ build and run of a few seconds, on one
/// core: so that they use every core), and prints their reports.
pub(crate) fn emulate_all(emulations: Vec<Emulation>) {
    let root = std::env::temp_dir().join(format!(
        "lab-cuda-emu-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let reports: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = emulations
            .iter()
            .enumerate()
            .map(|(n, e)| {
                let dir = root.join(format!("{n}-{}-{}", e.suffix, e.label.replace(' ', "")));
                s.spawn(move || e.run(&dir))
            })
            .collect();
        runs.into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    for report in reports {
        print!("{report}");
    }
    std::fs::remove_dir_all(&root).ok();
}

/// A kernel's parameter line as cubecl writes it: each tensor wrapped, the rest as it was.
#[test]
fn tensor_parameters_become_emu_globals() {
    let line = "    const __nv_bfloat16_8* __restrict__ buffer_0, float* buffer_1, \
                const uint32* __restrict__ dynamic_meta, const __grid_constant__ info_st info";
    assert_eq!(
        global_parameters(line).as_deref(),
        Some(
            "    emu::Global<const __nv_bfloat16_8> buffer_0, emu::Global<float> buffer_1, \
             const uint32* __restrict__ dynamic_meta, const __grid_constant__ info_st info"
        )
    );
    assert_eq!(global_parameters("const float l_5 = buffer_0[l_3];"), None);
}

/// The emulation itself (`cuda-emu/selftest.cpp`: small kernels whose outcome is known):
/// - a barrier of the block, or of the warp within it, orders shared memory and a shuffle does
///   not; a race is caught in either order of its accesses, two writes race, and what a thread
///   saw at a barrier leaves out what others did after it;
/// - shuffles and votes see their own block's and warp's values; a wmma product is right and
///   its lanes must pass the same tiles; a wmma store is written by the whole warp (a lane
///   reading it before `__syncwarp` races), whose lanes must pass the same tile, place, ldm
///   and layout; threads that end count as arrived at `__syncthreads`, over two blocks;
/// - blocks that each write their own element of global memory pass, and blocks that add
///   into one element (right one after another, a race at once) fail;
/// - within a block, the same barriers order global memory; a read and a write, or two
///   writes, of one element unordered fail, and so do unordered reads by several threads
///   before a write ordered after one of them only (in shared memory too); a cp.async source
///   written before the copy is waited for fails, by another thread or by the copy's own;
/// - a warp-wide operation that some lanes never reach, a barrier crossed with a shuffle, or
///   lanes meeting at different warp-wide operations end the run as a hang (exit 124), where
///   a GPU would hang or be undefined.
#[test]
fn the_emulation_catches_races_and_hangs() {
    let dir = std::env::temp_dir().join(format!("lab-cuda-emu-selftest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let binary = dir.join("selftest");
    build(
        "selftest.cpp",
        &dir,
        std::iter::empty(),
        &binary,
        "selftest.cpp",
    );
    // What a wmma store's check says of lanes that passed different arguments.
    const STORE_DIFFERS: &str =
        "wmma::store_matrix_sync: lane 1 of warp 0 passed another tile, place, ldm or layout";
    // What a wmma product's check says of lanes that passed other tiles.
    const PRODUCT_DIFFERS: &str =
        "wmma::mma_sync: lane 0 of warp 0 passed other tiles than lane 31";
    // Each case, its exit code (`None`: ended by a signal, the race detector's abort) and what
    // its error says (nothing, for the cases that are right).
    let cases = [
        ("ordered_by_block_barrier", Some(0), ""),
        ("ordered_by_warp_barrier", Some(0), ""),
        ("exchange", Some(0), ""),
        ("shuffle_by_block", Some(0), ""),
        ("some_end", Some(0), ""),
        ("tile_product", Some(0), ""),
        ("tile_store_then_syncwarp", Some(0), ""),
        ("blocks_apart", Some(0), ""),
        ("global_ordered_by_block_barrier", Some(0), ""),
        ("reads_then_ordered_write", Some(0), ""),
        ("global_reads_then_ordered_write", Some(0), ""),
        ("copy_source_written_after_wait", Some(0), ""),
        (
            "unordered",
            None,
            "race (read after write) at byte 0: thread 1 against 0,",
        ),
        (
            "warp_barrier_across_warps",
            None,
            "race (read after write) at byte 0: thread 33 against 0,",
        ),
        (
            "shuffle_orders_nothing",
            None,
            "race (read after write) at byte 0: thread 1 against 0,",
        ),
        (
            "read_then_write",
            None,
            "race (write after read) at byte 0: thread 0 against 1,",
        ),
        (
            "reads_then_write",
            None,
            "race (write after read) at byte 0: thread 160 against 65,",
        ),
        (
            "last_writes",
            None,
            "race (read after write) at byte 0: thread 0 against 63,",
        ),
        (
            "both_write",
            None,
            "race (write after write) at byte 0: thread 1 against 0,",
        ),
        (
            "blocks_add_into_one",
            None,
            "global-memory race between blocks (read after write)",
        ),
        (
            "blocks_write_one",
            None,
            "global-memory race between blocks (write after write)",
        ),
        (
            "blocks_read_one_write_one",
            None,
            "global-memory race between blocks (write after read)",
        ),
        (
            "global_warp_barrier_across_warps",
            None,
            "global-memory race in a block (read after write): thread 33 against 0,",
        ),
        (
            "global_both_write",
            None,
            "global-memory race in a block (write after write): thread 1 against 0,",
        ),
        (
            "global_read_then_write",
            None,
            "global-memory race in a block (write after read): thread 0 against 1,",
        ),
        (
            "global_reads_then_write",
            None,
            "global-memory race in a block (write after read): thread 160 against 65,",
        ),
        (
            "copy_source_written_by_other",
            None,
            "global-memory race in a block (write after read): thread 1 against 0,",
        ),
        (
            "copy_source_written_by_own",
            None,
            "cp.async: thread 0 writes global memory at",
        ),
        (
            "tile_store_then_read",
            None,
            "race (read after write) at byte 124: thread 0 against 31,",
        ),
        (
            "tile_store_elsewhere",
            None,
            STORE_DIFFERS,
        ),
        (
            "tile_store_other_layout",
            None,
            STORE_DIFFERS,
        ),
        (
            "tile_store_other_ldm",
            None,
            STORE_DIFFERS,
        ),
        (
            "tile_store_by_partial_warp",
            None,
            "wmma::store_matrix_sync: warp 1 has 16 lanes, not 32",
        ),
        (
            "tile_store_of_other_tiles",
            None,
            STORE_DIFFERS,
        ),
        (
            "tile_store_by_half_warp",
            Some(124),
            "lanes of a warp meet at different warp-wide operations",
        ),
        ("tile_product_of_other_a", None, PRODUCT_DIFFERS),
        ("tile_product_of_other_b", None, PRODUCT_DIFFERS),
        ("tile_product_of_other_c", None, PRODUCT_DIFFERS),
        (
            "partial_shuffle",
            Some(124),
            "hangs: a lane ended while others of its warp wait",
        ),
        (
            "shuffle_after_lanes_ended",
            Some(124),
            "hangs: a warp-wide operation (shuffle, vote, __syncwarp, ldmatrix, mma, a wmma store) after",
        ),
        (
            "crossed",
            Some(124),
            "hangs: 64 threads wait at barriers or warp-wide operations",
        ),
        (
            "mixed_meetings",
            Some(124),
            "hangs: lanes of a warp meet at different warp-wide operations",
        ),
    ];
    // Every case the self-test has is checked here: one added there alone would never run.
    let listed = Command::new(&binary)
        .arg("--list")
        .output()
        .expect("the emulation's self-test lists its cases");
    let mut there: Vec<&str> = std::str::from_utf8(&listed.stdout)
        .expect("case names")
        .lines()
        .collect();
    let mut here: Vec<&str> = cases.iter().map(|(case, _, _)| *case).collect();
    there.sort_unstable();
    here.sort_unstable();
    assert_eq!(there, here, "selftest.cpp's cases against this test's");
    for (case, code, error) in cases {
        let run = Command::new("timeout")
            .arg(EMULATION_LIMIT_S.to_string())
            .args([binary.as_os_str(), case.as_ref()])
            .output()
            .expect("the emulation's self-test runs (under coreutils' timeout)");
        let stderr = String::from_utf8_lossy(&run.stderr);
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert_eq!(run.status.code(), code, "{case}: {stdout}{stderr}");
        let said = if error.is_empty() {
            stderr.is_empty()
        } else {
            stderr.contains(error)
        };
        assert!(said, "{case}: wanted {error:?}, got {stderr:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
