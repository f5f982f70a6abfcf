#!/usr/bin/env bash
# The GPU figures issues 11 and 13 ask for, in stages that each fit one lent-device call
# (under 10 minutes, on a machine that may be fresh each call), given binaries built on a
# machine with Rust by scripts/gpu/build.sh: .bin/lab.xz (lab --features cuda), .bin/nccl-test
# and, for the kernel tests, .bin/tests/kernels.xz, ops.xz and model.xz (each crate's
# tests/main.rs built with --features cuda), 64 MiB at most with the working tree.
#
# The first run on a fresh host compiles every kernel with NVRTC, about a second each: x1-50m's
# first steps wait ~100 s, its first evaluation ~60 s more. They are kept in LAB_KERNEL_CACHE
# (default here $WORK/kernel-cache), so the same host compiles them once.
#
# On the GPU host (the device call's `carry`: [".bin"]), one stage per call; with 15 minutes
# of device time a lease is one call of `lease`:
#
#   scripts/gpu/session.sh lease   [...] [--budget SECONDS]
#   scripts/gpu/session.sh smoke   [--lab PATH] [--nccl-test PATH] [--out DIR] [--config FILE] [--device cuda|cpu] [--steps N]
#   scripts/gpu/session.sh curves  [...]
#   scripts/gpu/session.sh memory  [...]
#   scripts/gpu/session.sh compare [...]
#   scripts/gpu/session.sh kernels [...]
#
# Every stage runs the config at 2 micro-batches a step, not the recipe's 16 (64K tokens a
# step for x1-50m): the figures are tokens/s, MFU, memory and loss curves, and 16 would make
# each step 8× longer without changing them much (the optimizer's share grows a little).
#
# lease:   for a lease of 15 minutes of device time, one call: the questions the other stages
#          answer, most decisive first, each step given at most what is left of --budget
#          (default 520 s; call with timeout_s 600) and skipped when under a minute is left,
#          the summary and logs returned after every step, so a call cut off still returns
#          what ran. Order: the GPU; lab with both opt-in paths on (tensor-core attention,
#          cuBLASLt products) against PyTorch eager (bench.sh --no-compile); then every
#          module of the CUDA test binaries side by side (up to TESTS_TOGETHER, default 12,
#          at a time, 150 s for all, none started with under 30 s left: they check results,
#          so they need not have the GPU to themselves, and each compiles its kernels on a
#          core of its own; 12 CUDA contexts and their pools on one GPU have not been
#          measured), those of the opt-in paths first, the tensor-core attention's also under
#          each switch below; after a slow headline and slow tests, the timed steps below may
#          find under a minute left and be skipped; the
#          tensor-core attention's split with its row-wise work in registers and through
#          shared rows (LAB_ATTENTION_ROWS=bounce), and in registers at one block of query
#          rows a warp (LAB_ATTENTION_QUERY_BLOCKS=1) and with one stage of tiles, no
#          cp.async (LAB_ATTENTION_STAGES=1); lab as it trains by default (the split, to set
#          against the H100's 557 ms, then each kernel's time: scripts/launches.sh --times);
#          200 bf16 steps with both paths on; if time is left, the split with the f32
#          attention one unit a row (LAB_ATTENTION_SHUFFLE=0) and a bench with each of
#          cubecl's pool layouts (LAB_GPU_POOLS). Needs .bin/lab and .bin/tests
#          (scripts/gpu/build.sh).
# smoke:   the GPU; lab bench in bf16 (tokens/s, MFU, peak memory) and its split by op class
#          (on CUDA again: the attention one unit a row, LAB_ATTENTION_SHUFFLE=0, and also
#          rolled, LAB_ATTENTION_UNROLL=0; the tensor-core attention, LAB_ATTENTION_MMA=1;
#          the projections on cuBLASLt, LAB_MATMUL=cublaslt);
#          the plan; cubecl's matmul on the model's shapes, and on CUDA cuBLASLt's through
#          lab's projection op (LAB_MATMUL=cublaslt); NCCL at world size 1 (issue 13's
#          must-show 4).
# curves:  tinyshakespeare prepared on the host; --steps (200) in bf16, then in fp32; both
#          curves on one chart and as CSV.
# memory:  20 steps with selective checkpointing; 10 with the micro-batch --fit-micro-batch
#          picks; lab bench with each of cubecl's pool layouts (LAB_GPU_POOLS=sliced,
#          exclusive): the pool's peak against the live tensors.
# compare: scripts/gpu/bench.sh: lab against PyTorch eager and torch.compile, one table.
# kernels: every test binary in .bin/tests/ (or .bin/tests/*.xz), one step per test file
#          (module) with 400 s each (a fresh host compiles each kernel with NVRTC first, ~1 s
#          each): the kernels' fp64-reference tests on CUDA, bf16 and the tensor-core
#          attention included. Needs no lab binary.
#
# Environment passes through: `LAB_ATTENTION_MMA=1 session.sh curves` trains the bf16 curve
# with the tensor-core attention (the fp32 one keeps the CUDA-core kernels).
#
# The work (data, run folders, logs) goes to $WORK (default /tmp/lab-session). What comes
# back goes to --out (default $OUT, where a device call returns at most 8 files): the
# stage's summary and one STAGE.tar.gz of its logs, charts, CSVs, metrics and events (no
# checkpoints). `--device cpu --config configs/tiny-cpu.toml --steps 6` runs the same
# plumbing on a CPU.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
stage="${1:-}"
[ $# -gt 0 ] && shift
lab="$repo/.bin/lab"
nccl_test="$repo/.bin/nccl-test"
out="${OUT:-$repo/runs/gpu-session}"
work="${WORK:-/tmp/lab-session}"
config="$repo/configs/x1-50m-a100.toml"
device=cuda
steps=200
budget=520
# Kernel-test processes at a time in the lease (tests_together).
together="${TESTS_TOGETHER:-12}"
while [ $# -gt 0 ]; do
  case "$1" in
    --lab) lab="$2"; shift 2 ;;
    --nccl-test) nccl_test="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    *) echo "session.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$stage" in lease|smoke|curves|memory|compare|kernels) ;; *)
  echo "session.sh: the first argument is the stage: lease, smoke, curves, memory, compare or kernels (see the header of $0)" >&2
  exit 2 ;;
esac
case "$budget" in ''|*[!0-9]*)
  echo "session.sh: --budget $budget: give whole seconds, e.g. --budget 520" >&2; exit 2 ;;
esac
case "$together" in ''|0|*[!0-9]*)
  echo "session.sh: TESTS_TOGETHER=$together: give a whole number of test processes, e.g. 12" >&2; exit 2 ;;
esac
case "$device" in cuda|cpu) ;; *)
  echo "session.sh: --device $device: use cuda or cpu" >&2; exit 2 ;;
esac
# `unxz_to PACKED BINARY`: an executable from its xz (python3's lzma: xz may be missing).
unxz_to() {
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$1" "$2" && chmod +x "$2"
}
# A compressed binary (see above) is unpacked next to itself. Without lab, the lease still runs
# the kernel tests (each lab step then fails on its own).
if [ ! -x "$lab" ] && [ -f "$lab.xz" ]; then
  unxz_to "$lab.xz" "$lab" || { echo "session.sh: cannot unpack $lab.xz" >&2; rm -f "$lab"; }
fi
[ -x "$lab" ] || [ "$stage" = kernels ] || [ "$stage" = lease ] || { echo "session.sh: no lab binary at $lab; pass --lab PATH" >&2; exit 2; }
# NCCL (and NVRTC) from PyTorch's pip wheels when the system has no libnccl: cudarc loads them
# by name at run time.
# (grep without -q: under pipefail, -q's early exit can fail ldconfig with a broken pipe.)
# PyTorch (bench.sh) runs with the caller's library path, not this one: its wheels bring their own
# CUDA libraries, which the toolkit's, if older, would shadow.
export PYTORCH_LD_LIBRARY_PATH="${PYTORCH_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}"
if ! ldconfig -p | grep 'libnccl\.so' >/dev/null; then
  wheels="$(python3 -c 'import nvidia, os; print(":".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, d, "lib"))))' 2>/dev/null || true)"
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64${wheels:+:$wheels}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
logs="$work/logs-$stage"
# lab's compiled kernels, kept for the call's later runs of lab even where HOME is unset.
export LAB_KERNEL_CACHE="${LAB_KERNEL_CACHE:-$work/kernel-cache}"
# A fresh log folder, and a mark of when this call began: the archive holds this call's steps
# and runs, not an earlier call's on the same warm machine.
rm -rf "$logs"
mkdir -p "$out" "$logs"
started="$work/.started-$stage"
touch "$started"
summary="$out/summary-$stage.txt"
backend="$device"

# Runs "$@", its output shown and kept in $logs/$name.log; a failure is recorded, not fatal,
# so one broken step does not cost the rest of the call. Under a `deadline` (the lease) a step
# gets at most what is left of it, and at most `cap` seconds where `within` sets one; with
# under a minute left it is recorded as skipped. The archive is packed after every step, so a
# call cut off later still returns what ran.
step() {
  local name="$1"; shift
  if [ -n "${deadline:-}" ]; then
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 60 ]; then
      echo "SKIPPED $name (${left} s of the budget left)" | tee -a "$summary"
      return
    fi
    local limit="$left"
    if [ -n "${cap:-}" ] && [ "$cap" -lt "$left" ]; then limit="$cap"; fi
    # -k: a step that ignores SIGTERM (a hung GPU, a long compile) is killed 20 s later.
    set -- timeout -k 20 "$limit" "$@"
  fi
  echo "== $name: $*"
  if "$@" 2>&1 | tee "$logs/$name.log"; then
    echo "ok $name" >> "$summary"
  else
    echo "FAILED $name (exit ${PIPESTATUS[0]}), see $name.log" | tee -a "$summary"
  fi
  pack_or_warn
}

# A failed pack (tar: a full disk) is said, not fatal: the steps after it still run.
pack_or_warn() {
  pack || echo "session.sh: packing $out/$stage.tar.gz failed; the last whole archive stays" >&2
}

# Runs FUNCTION ARGS… (step, run, …) with each of its steps given at most CAP seconds.
within() {
  local cap="$1"; shift
  "$@"
}

# The config at 2 micro-batches a step, evaluated on 2 batches; prints its path.
short_config() {
  sed -e 's/^grad_accum = .*/grad_accum = 2/' -e 's/^eval_batches = .*/eval_batches = 2/' \
    "$config" > "$work/short.toml"
  echo "$work/short.toml"
}

# Prepares tinyshakespeare (GPT-2 BPE, nanoGPT's 90/10 split) once; prints the folder.
data() {
  local dir="$work/data"
  # meta.json is written last: a prepare cut off before it is redone.
  [ -f "$dir/meta.json" ] || step prepare "$lab" data prepare >&2 \
    --input "$repo/crates/data/corpora/tinyshakespeare.txt" --output-dir "$dir" --split chars:0.9
  echo "$dir"
}

# Trains the short config: run NAME STEPS FLAGS…, into $work/run-NAME (from scratch).
run() {
  local name="$1" n="$2"; shift 2
  rm -rf "$work/run-$name"
  step "train-$name" "$lab" train --config "$(short_config)" --data-dir "$(data)" \
    --backend "$backend" --total-steps "$n" --log-every 10 --eval-every 50 --ckpt-every "$n" \
    --ckpt-dir "$work/run-$name" "$@"
}

smoke() {
  local cfg
  cfg="$(short_config)"
  if [ "$device" = cuda ]; then step gpu nvidia-smi; fi
  step bench "$lab" bench --backend "$backend" --config "$cfg" --precision bf16 \
    --steps 10 --warmup 3 --json
  step split "$lab" bench --backend "$backend" --config "$cfg" --precision bf16 \
    --steps 5 --warmup 2 --split
  if [ "$device" = cuda ]; then
    # The attention kernels with their loops rolled, one unit a row, as before both changes.
    step split-rolled env LAB_ATTENTION_UNROLL=0 LAB_ATTENTION_SHUFFLE=0 "$lab" bench \
      --backend "$backend" --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    # The f32 attention one unit a row, as before rows were shared by warp shuffles.
    step split-one-lane env LAB_ATTENTION_SHUFFLE=0 "$lab" bench --backend "$backend" \
      --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    # The attention on tensor cores (opt-in until this and the kernel tests pass).
    step split-mma env LAB_ATTENTION_MMA=1 "$lab" bench --backend "$backend" \
      --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    # The projections on cuBLASLt (opt-in until this and the gemm tests pass).
    step split-cublaslt env LAB_MATMUL=cublaslt "$lab" bench --backend "$backend" \
      --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
  fi
  step plan "$lab" plan --config "$config"
  step matmul "$lab" bench --backend "$backend" --config "$cfg" --precision bf16 \
    --matmul --steps 20
  if [ "$device" = cuda ]; then
    step matmul-cublaslt env LAB_MATMUL=cublaslt "$lab" bench --backend "$backend" \
      --config "$cfg" --precision bf16 --matmul --steps 20
  fi
  if [ "$device" = cuda ]; then
    if [ -x "$nccl_test" ]; then
      step nccl "$nccl_test" --ignored --nocapture
    else
      echo "FAILED nccl: no test binary at $nccl_test (see the header)" | tee -a "$summary"
    fi
  fi
}

curves() {
  run bf16 "$steps" --precision bf16
  run fp32 "$steps" --precision fp32
  step compare-curves "$lab" compare --run "bf16=$work/run-bf16" --run "fp32=$work/run-fp32" \
    --output "$logs/bf16-vs-fp32.png" --csv "$logs/bf16-vs-fp32.csv"
}

memory() {
  run selective 20 --precision bf16 --activation-checkpointing selective
  if [ "$device" = cuda ]; then run fit 10 --precision bf16 --fit-micro-batch; fi
  pools
}

# cubecl's two layouts of its memory pools (LAB_GPU_POOLS): the pool's peak against the live
# tensors, NVML's reading and tokens/s, each in one bench.
pools() {
  local layout
  for layout in sliced exclusive; do
    step "pools-$layout" env LAB_GPU_POOLS="$layout" "$lab" bench --backend "$backend" \
      --config "$(short_config)" --precision bf16 --steps 5 --warmup 2
  done
}

compare() {
  step bench-sh "$here/bench.sh" --lab "$lab" --config "$(short_config)" --device "$device"
}

# The GPU test binaries in .bin/tests (each crate's tests/main.rs), unpacked when compressed.
tests="$repo/.bin/tests"
# A binary that does not unpack (a truncated carry, a full disk) is recorded and removed; the
# others still run.
unpack_tests() {
  for packed in "$tests"/*.xz; do
    [ -f "$packed" ] || continue
    [ -x "${packed%.xz}" ] && continue
    if ! unxz_to "$packed" "${packed%.xz}"; then
      echo "FAILED unpack $(basename "$packed")" | tee -a "$summary"
      rm -f "${packed%.xz}"
    fi
  done
  return 0
}

kernels() {
  local found=0
  unpack_tests
  for t in "$tests"/*; do
    [ -f "$t" ] && [ -x "$t" ] && [ "${t%.xz}" = "$t" ] || continue
    found=1
    # One step per test file: each is a module of the crate's one test binary. A binary that
    # lists nothing (it cannot load, say) runs whole, so its failure is a step's.
    local modules
    modules=$(modules_of "$t") || true
    [ -n "$modules" ] || step "test-$(basename "$t")" timeout 400 "$t" --test-threads 1
    for module in $modules; do
      step "test-$(basename "$t")-$module" timeout 400 "$t" "$module::" --test-threads 1
    done
  done
  [ "$found" = 1 ] || echo "FAILED kernels: no test binaries in $tests (see the header)" | tee -a "$summary"
}

# The kernel tests side by side, up to $together processes at a time: "[VAR=value…] BINARY
# FILTER [ARGS…]" each (words without spaces), BINARY one of .bin/tests. They check results,
# not speed, so they need not have the GPU to themselves; each process compiles its own kernels
# with NVRTC on one core (the test binaries keep no kernel cache), and the GPU hosts have 16.
# The first CAP seconds of the call are theirs (not `within`: the cap is the phase's, not each
# test's), within the lease's deadline; each test gets what is left of them when it starts
# (and its 20 s of grace, run_test), and one that would start with under 30 s left is skipped.
# The summary lists them in the order given; the archive is packed each time one ends.
tests_together() {
  local end=$((SECONDS + $1)) names=() spec name
  shift
  if [ -n "${deadline:-}" ] && [ "$deadline" -lt "$end" ]; then end="$deadline"; fi
  # Each test's summary line, written by its job; outside the logs, so not in the archive.
  statuses="$work/.status-$stage"
  rm -rf "$statuses" && mkdir -p "$statuses"
  for spec in "$@"; do
    # shellcheck disable=SC2086 # a spec is words
    name="$(test_step_name $spec)"
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$together" ]; do wait -n || true; pack_or_warn; done
    start_test "$name" $((end - SECONDS)) "$spec"
  done
  while [ -n "$(jobs -rp)" ]; do wait -n || true; pack_or_warn; done
  for name in "${names[@]}"; do
    cat "$statuses/$name" 2>/dev/null || echo "FAILED $name (no status)"
  done | tee -a "$summary"
  pack_or_warn
}

# `start_test NAME LIMIT SPEC`: SPEC (tests_together's) as a job with LIMIT seconds, its output
# in $logs/NAME.log, its summary line in $statuses/NAME; skipped with under 30 s.
start_test() {
  local name="$1" limit="$2" spec="$3"
  if [ "$limit" -lt 30 ]; then
    echo "SKIPPED $name (${limit} s of the tests' time left)" > "$statuses/$name"
    return
  fi
  echo "== $name: $spec (at most $limit s)"
  (
    local log="$logs/$name.log" rc=0
    # shellcheck disable=SC2086
    run_test "$limit" $spec > "$log" 2>&1 || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "FAILED $name (out of its $limit s), see $name.log"
    elif [ "$rc" != 0 ]; then
      echo "FAILED $name (exit $rc), see $name.log"
    elif grep -q '^running 0 tests' "$log"; then
      # A filter that matches nothing (a module renamed) passes in libtest.
      echo "FAILED $name (no test matches), see $name.log"
    else
      echo "ok $name"
    fi > "$statuses/$name"
  ) &
}

# `run_test LIMIT [VAR=value…] BINARY FILTER [ARGS…]`: the tests whose names contain FILTER in
# .bin/tests/BINARY, one at a time, killed after LIMIT seconds (-k: 20 s after that if it
# ignores SIGTERM).
run_test() {
  local limit="$1" envs=()
  shift
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  local binary="$1" filter="$2"
  shift 2
  timeout -k 20 "$limit" env ${envs[@]+"${envs[@]}"} "$tests/$binary" "$filter" --test-threads 1 "$@"
}

# A test step's name: test-BINARY-FILTER (:: as -), then each variable as -name-value
# (LAB_ATTENTION_STAGES=1: -stages-1), so that variants keep logs of their own; any other
# character a file name should not have as _.
test_step_name() {
  local suffix=""
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do
    suffix+="-$(echo "${1#LAB_ATTENTION_}" | tr 'A-Z=' 'a-z-')"
    shift
  done
  local filter="${2//::/-}"
  filter="${filter%-}"
  echo "test-$1${filter:+-$filter}$suffix" | tr -c 'A-Za-z0-9_.\n-' _
}

# The test modules of test binary BINARY (its tests' names up to the first ::), one a line.
modules_of() {
  "$1" --list --format terse 2>/dev/null | sed -n 's/::.*//p' | sort -u
}

# The binary and test module a spec (tests_together's) runs, as BINARY:MODULE.
spec_module() {
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do shift; done
  echo "$1:${2%%::*}"
}

# `other_modules SPEC…`: a spec ("BINARY module::") for each test module of the kernels, ops and
# model binaries in .bin/tests that no SPEC runs, so that a module added later is run too; the
# whole binary ("BINARY ::", every test's name has one) where it lists none (it cannot load).
other_modules() {
  local named=" " spec binary modules module
  for spec in "$@"; do
    # shellcheck disable=SC2086 # a spec is words
    named+="$(spec_module $spec) "
  done
  for binary in kernels ops model; do
    [ -x "$tests/$binary" ] || continue
    modules="$(modules_of "$tests/$binary")" || true
    [ -n "$modules" ] || { echo "$binary ::"; continue; }
    for module in $modules; do
      [[ "$named" == *" $binary:$module "* ]] || echo "$binary ${module}::"
    done
  done
}

lease() {
  local deadline=$((SECONDS + budget)) cfg
  cfg="$(short_config)"
  data >/dev/null
  if [ "$device" = cuda ]; then
    within 20 step gpu nvidia-smi
    # The headline first: lab with both opt-in paths against PyTorch eager, same GPU, same
    # windows (its first lab run also compiles most kernels, ~100 s on a fresh host).
    # Its figures are kept in the archive as each is measured (BENCH_OUT).
    BENCH_OUT="$logs/compare-new" LAB_ATTENTION_MMA=1 LAB_MATMUL=cublaslt \
      within 300 step compare-new "$here/bench.sh" \
      --lab "$lab" --config "$cfg" --device "$device" --steps 20 --warmup 3 --no-compile
    # Whether the kernels are right on this GPU, bf16 included, the opt-in paths first (they
    # become the default only if so): every module of every test binary, side by side.
    unpack_tests
    local first=(
      "kernels attention::tensor_core" "kernels gemm::" "ops projection::"
      "LAB_ATTENTION_ROWS=bounce kernels attention::tensor_core"
      "LAB_ATTENTION_QUERY_BLOCKS=1 kernels attention::tensor_core"
      "LAB_ATTENTION_STAGES=1 kernels attention::tensor_core"
      "model fused_attention::" "model mixed_precision::"
      "kernels attention:: --skip attention::tensor_core"
    ) rest=()
    mapfile -t rest < <(other_modules "${first[@]}")
    tests_together 150 "${first[@]}" ${rest[@]+"${rest[@]}"}
    # The tensor-core attention with its row-wise work in the products' registers (the
    # default) against the same through shared bounce rows (LAB_ATTENTION_ROWS=bounce).
    within 90 step split-mma env LAB_ATTENTION_MMA=1 "$lab" bench --backend "$backend" \
      --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    within 90 step split-mma-bounce env LAB_ATTENTION_MMA=1 LAB_ATTENTION_ROWS=bounce "$lab" \
      bench --backend "$backend" --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    # The register forward and dQ at one block of 16 query rows a warp (4 cubes an SM at
    # hd 64) against the default two (2 cubes an SM, half the shared-memory reads a product).
    within 90 step split-mma-one-block env LAB_ATTENTION_MMA=1 LAB_ATTENTION_QUERY_BLOCKS=1 \
      "$lab" bench --backend "$backend" --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    # The same loading each tile, then computing it (LAB_ATTENTION_STAGES=1), against the
    # default's next tile copied by cp.async while the cube computes one.
    within 90 step split-mma-one-stage env LAB_ATTENTION_MMA=1 LAB_ATTENTION_STAGES=1 \
      "$lab" bench --backend "$backend" --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
  else
    BENCH_OUT="$logs/compare" within 240 step compare "$here/bench.sh" --lab "$lab" \
      --config "$cfg" --device "$device" --steps 2 --warmup 1 --no-compile
  fi
  within 150 step split "$lab" bench --backend "$backend" --config "$cfg" --precision bf16 \
    --steps 5 --warmup 2 --split
  if [ "$device" = cuda ]; then
    # Each kernel's time in a step as it trains by default (cubecl's products included).
    within 90 step kernel-times "$repo/scripts/launches.sh" --lab "$lab" --config "$cfg" \
      --backend cuda --times
    LAB_ATTENTION_MMA=1 LAB_MATMUL=cublaslt run new "$steps" --precision bf16
    # If time is left: the f32 attention one unit a row, against `split`'s shared rows.
    within 120 step split-one-lane env LAB_ATTENTION_SHUFFLE=0 "$lab" bench \
      --backend "$backend" --config "$cfg" --precision bf16 --steps 5 --warmup 2 --split
    within 90 pools
  fi
}

# The stage's logs, and each run folder's record without its checkpoints, in one archive.
pack() {
  local runs=()
  for r in "$work"/run-*; do [ -d "$r" ] && [ "$r" -nt "$started" ] && runs+=("$(basename "$r")"); done
  # Under a temporary name beside it, renamed when whole: a call cut off mid-write still
  # returns the last whole archive.
  # tar's exit 1 is a file that changed as it read it (a test still writing its log): the
  # archive is whole. (Statuses by hand, not set -e: pack_or_warn calls this where set -e does
  # not apply.)
  local rc=0
  tar -czf "$out/$stage.tar.gz.tmp" -C "$work" --warning=no-file-changed \
    --exclude='step-*' --exclude='.step-*' --exclude='latest' --exclude='*.u32' \
    "logs-$stage" ${runs[@]+"${runs[@]}"} || rc=$?
  if [ "$rc" -gt 1 ]; then
    rm -f "$out/$stage.tar.gz.tmp"
    return 1
  fi
  mv "$out/$stage.tar.gz.tmp" "$out/$stage.tar.gz"
}

echo "session.sh $stage: lab $lab, config $config, device $device, work in $work, results in $out"
if [ -f "$repo/.bin/BUILT" ]; then echo "session.sh: .bin built from $(cat "$repo/.bin/BUILT")"; fi
: > "$summary"
[ -x "$lab" ] || [ "$stage" = kernels ] || echo "FAILED lab: no binary at $lab (lab's steps fail below)" | tee -a "$summary"
"$stage"
echo "== summary ($summary; logs in $out/$stage.tar.gz)"
cat "$summary"
! grep -q '^FAILED' "$summary"
