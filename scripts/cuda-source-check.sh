#!/usr/bin/env bash
# Compiles every lab-kernels kernel's CUDA C++ with NVRTC and prints ptxas's registers and
# spills, the shared memory cubecl allots, the machine code's instructions (nvdisasm: a static
# count, each loop body once), NVRTC's seconds and ptxas's (the driver's compile at load), for
# each, on a machine with no GPU and no CUDA toolkit: the check a kernel change can have before
# a GPU host runs it (a kernel that does not compile there costs a device call). Speed and
# results still need the GPU.
#
#   scripts/cuda-source-check.sh [--out DIR] [--arch sm_80|sm_90a ...] [--only GLOB]
#                                [--both-targets] [--nvrtc DIR]
#
# NVRTC compiles to PTX for the virtual architecture (compute_90a for sm_90a), as lab's
# cubecl-cuda does (vendor/cubecl-cuda/LAB-PATCH.md); --both-targets also compiles for the real
# one, as the release does (NVRTC then runs ptxas too), checks that the PTX is the same bytes
# and prints both totals. --nvrtc takes another CUDA's NVRTC and ptxas: a folder with
# lib/libnvrtc.so.*, include/ and bin/ptxas, as NVIDIA's CUDA 13 wheels unpack
# (nvidia-cuda-nvrtc, -runtime, -crt and -nvcc 13.0.* into one folder: DIR is its nvidia/cu13).
#
# --only compiles the kernels whose names match GLOB (e.g. 'mma-grad_kv*'). A kernel's shared
# arrays take the same offsets in every run (vendor/cubecl-opt/LAB-PATCH.md: without that
# patch ptxas's registers moved with a layout drawn per process).
#
# NVRTC, the CUDA headers and ptxas come from NVIDIA's pip wheels (CUDA 12.9; ~150 MB,
# downloaded once into $LAB_CUDA_WHEELS, default ~/.cache/lab/cuda-wheels), nvdisasm from
# CUDA 13.5's (the only one on PyPI; it reads 12.9's cubins). The sources come
# from lab-kernels' `writes_the_cuda_sources` (kernels/src/cuda_source.rs), which
# needs the wgpu stack (lavapipe: apt-get install mesa-vulkan-drivers libvulkan1).
# Default architectures: sm_80 (A100, the course's GPU) and sm_90a (H100/H200, as cubecl
# compiles for them).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
out=/tmp/lab-cuda-source
archs=()
only='*'
both_targets=0
nvrtc_dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --arch) archs+=("$2"); shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --both-targets) both_targets=1; shift ;;
    --nvrtc)
      [ -f "$(ls "${2:-}"/lib/libnvrtc.so.* 2>/dev/null | head -1)" ] || {
        echo "cuda-source-check.sh: --nvrtc ${2:-}: no lib/libnvrtc.so.* there; give the folder of NVIDIA's unpacked CUDA wheels (nvidia/cu13)" >&2
        exit 2
      }
      nvrtc_dir="$(cd "$2" && pwd)"; shift 2 ;;
    *) echo "cuda-source-check.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ ${#archs[@]} -gt 0 ] || archs=(sm_80 sm_90a)
# Absolute: the test that writes the sources runs in the package's folder, not the caller's.
mkdir -p "$out" && out="$(cd "$out" && pwd)"
wheels="${LAB_CUDA_WHEELS:-$HOME/.cache/lab/cuda-wheels}"
cuda="$wheels/nvidia"

# Extracted once; the marker is written last, so an interrupted extraction is redone.
if [ ! -f "$wheels/extracted" ]; then
  echo "== NVRTC, headers and ptxas from pip into $wheels"
  mkdir -p "$wheels/download"
  python3 -m pip download --quiet --no-deps -d "$wheels/download" \
    nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 \
    nvidia-cuda-nvcc-cu12==12.9.86
  for w in "$wheels"/download/*.whl; do python3 -m zipfile -e "$w" "$wheels"; done
  chmod +x "$cuda/cuda_nvcc/bin/ptxas"
  touch "$wheels/extracted"
fi
if [ ! -f "$wheels/extracted-nvdisasm" ]; then
  python3 -m pip download --quiet --no-deps -d "$wheels/download" nvidia-cuda-nvdisasm==13.5.37
  python3 -m zipfile -e "$wheels"/download/nvidia_cuda_nvdisasm-*.whl "$wheels"
  chmod +x "$cuda/cu13/bin/nvdisasm"
  touch "$wheels/extracted-nvdisasm"
fi

echo "== CUDA C++ of the kernels into $out"
rm -f "$out"/*.cu "$out"/*.ptx "$out"/*.cubin
log="$out/writes_the_cuda_sources.log"
if ! (cd "$repo" && LAB_CUDA_SOURCE_DIR="$out" XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" \
  cargo test --release -p lab-kernels --features cuda-source --lib -- \
  --ignored --exact cuda_source::writes_the_cuda_sources) >"$log" 2>&1; then
  tail -40 "$log" >&2
  echo "cuda-source-check.sh: writing the sources failed (whole log: $log)" >&2
  exit 1
fi

echo "== NVRTC and ptxas (${archs[*]})"
nvrtc_lib="${nvrtc_dir:+$nvrtc_dir/lib}"
LD_LIBRARY_PATH="${nvrtc_lib:-$cuda/cuda_nvrtc/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  python3 - "$cuda" "$out" "$only" "$both_targets" "$nvrtc_dir" "${archs[@]}" <<'EOF'
import ctypes, glob, os, re, subprocess, sys, time

cuda, out, only, both_targets, nvrtc_dir, archs = (
    sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5], sys.argv[6:])
if nvrtc_dir:
    nvrtc = ctypes.CDLL(sorted(glob.glob(os.path.join(nvrtc_dir, "lib/libnvrtc.so.*")))[0])
    includes = [os.path.join(nvrtc_dir, "include")]
    ptxas = os.path.join(nvrtc_dir, "bin/ptxas")
else:
    nvrtc = ctypes.CDLL(os.path.join(cuda, "cuda_nvrtc/lib/libnvrtc.so.12"))
    includes = [os.path.join(cuda, d, "include") for d in ("cuda_runtime", "cuda_nvcc")]
    ptxas = os.path.join(cuda, "cuda_nvcc/bin/ptxas")
nvdisasm = os.path.join(cuda, "cu13/bin/nvdisasm")


def ptx(source, arch):
    """NVRTC's PTX for `source`, with cubecl-cuda's options but `arch` (lab's cubecl-cuda
    passes the virtual one, `compute_90a`), and the seconds NVRTC took; raises with the log on
    error."""
    prog = ctypes.c_void_p()
    text = open(source, "rb").read()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text, source.encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"-lineinfo"]
    opts += [f"--include-path={p}".encode() for p in includes]
    try:
        started = time.perf_counter()
        failed = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        seconds = time.perf_counter() - started
        size = ctypes.c_size_t()
        if failed:
            nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(log.value.decode())
        nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetPTX(prog, buf)
        return buf.value, seconds
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def usage(ptx_file, arch):
    """(registers, spill bytes: stores plus loads) that ptxas reports, the machine code's
    instruction count (static: a loop's body counts once), and ptxas's seconds."""
    cubin = ptx_file[:-4] + ".cubin"
    started = time.perf_counter()
    info = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", cubin, ptx_file],
                          capture_output=True, text=True, check=True).stderr
    seconds = time.perf_counter() - started
    regs = re.search(r"Used (\d+) registers", info)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    instructions = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s", sass, re.M))
    return (int(regs.group(1)) if regs else 0, sum(spills), instructions, seconds)


def shared_bytes(source):
    """The dynamic shared memory cubecl allots (ptxas cannot see it): the end of its last
    array, each declared under a comment with its size (as the kernels' A100 test reads it)."""
    pairs = re.findall(r"// Shared array size: \d+, (\d+) bytes\n.*?dynamic_shared_mem\[(\d+)\]",
                       open(source).read())
    return max((int(size) + int(offset) for size, offset in pairs), default=0)


def virtual(arch):
    """The virtual architecture of a real one: compute_90a for sm_90a."""
    return arch.replace("sm_", "compute_", 1)


failed = 0
# Seconds per architecture: NVRTC to PTX (virtual), ptxas, and with --both-targets NVRTC for
# the real architecture; and the kernels whose PTX differed between the two.
compile_s = {arch: 0.0 for arch in archs}
ptxas_s = {arch: 0.0 for arch in archs}
real_s = {arch: 0.0 for arch in archs}
differ = {arch: [] for arch in archs}
print(f"{'kernel':38} {'arch':7} {'regs':>5} {'spill B':>8} {'shared B':>9} {'sass':>6} {'nvrtc s':>8}"
      f" {'ptxas s':>8}")
sources = sorted(glob.glob(os.path.join(out, f"{only}.cu")))
if not sources:
    print(f"cuda-source-check.sh: no kernel matches --only {only!r} (names: {out}/*.cu)")
    sys.exit(1)
for source in sources:
    name = os.path.basename(source)[:-3]
    for arch in archs:
        try:
            ptx_file = os.path.join(out, f"{name}.{arch}.ptx")
            ptx_text, seconds = ptx(source, virtual(arch))
            compile_s[arch] += seconds
            if both_targets:
                real_text, real_seconds = ptx(source, arch)
                real_s[arch] += real_seconds
                if real_text != ptx_text:
                    differ[arch].append(name)
            open(ptx_file, "wb").write(ptx_text)
            regs, spill, sass, assembled = usage(ptx_file, arch)
            ptxas_s[arch] += assembled
            print(f"{name:38} {arch:7} {regs:5} {spill:8} {shared_bytes(source):9} {sass:6} {seconds:8.2f}"
                  f" {assembled:8.2f}")
        except (RuntimeError, subprocess.CalledProcessError) as err:
            failed += 1
            detail = getattr(err, "stderr", None) or str(err)
            print(f"{name:38} {arch:7} FAILED\n{detail[:4000]}")
for arch, seconds in compile_s.items():
    print(f"NVRTC for {arch}: {seconds:.1f} s to PTX ({virtual(arch)}), ptxas {ptxas_s[arch]:.1f} s,"
          " the kernels that compiled, one after another")
    if both_targets:
        same = "the same PTX" if not differ[arch] else f"PTX differs: {' '.join(differ[arch])}"
        print(f"NVRTC for {arch}: {real_s[arch]:.1f} s to PTX and cubin ({arch}); {same}")
print(f"{failed} failed" if failed else "all compiled")
sys.exit(1 if failed or any(differ.values()) else 0)
EOF
