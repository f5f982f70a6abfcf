#!/usr/bin/env bash
# How many GPU kernels a training step launches, by kernel: the host's share of a step grows
# with this count (each launch costs the host microseconds, whatever the kernel's size).
#
#   scripts/launches.sh --lab PATH --config FILE [--backend wgpu|cuda] [--steps N]
#
# Runs `lab bench` (one warm-up step, then N, default 2) in a scratch folder whose cubecl.toml
# turns on cubecl's launch log (profiling level "minimal": each launch's name, no timing, no
# waits), cuts the log into steps at the optimizer's last AdamW launch, and prints the launches
# of each timed step and, for the last one, their count by kernel. The difference between
# configs with grad_accum 1 and 2 is what one more micro-batch launches.
# Only cubecl's launches are logged: on CUDA the products cuBLASLt runs (LAB_MATMUL=cublaslt)
# are not counted, and a cubecl.toml takes the place of lab's kernel cache, so every kernel
# compiles again.
set -euo pipefail
lab="" config="" backend=wgpu steps=2
while [ $# -gt 0 ]; do
  [ $# -gt 1 ] || { echo "launches.sh: $1 needs a value (see the header of $0)" >&2; exit 2; }
  case "$1" in
    --lab) lab="$2" ;;
    --config) config="$2" ;;
    --backend) backend="$2" ;;
    --steps) steps="$2" ;;
    *) echo "launches.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
[ -x "$lab" ] || { echo "launches.sh: no lab binary at '$lab'; pass --lab PATH (built with --features wgpu or cuda)" >&2; exit 2; }
[ -f "$config" ] || { echo "launches.sh: no config at '$config'; pass --config FILE" >&2; exit 2; }
case "$backend" in wgpu|cuda) ;; *)
  echo "launches.sh: --backend $backend: cubecl logs launches on wgpu or cuda only" >&2; exit 2 ;;
esac
lab="$(realpath "$lab")" config="$(realpath "$config")"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cat > "$scratch/cubecl.toml" <<EOF
[profiling.logger]
level = "minimal"
file = '$scratch/launches.log'
append = false
EOF
(cd "$scratch" && "$lab" bench --backend "$backend" --config "$config" --steps "$steps" \
  --warmup 1 >&2)
[ -s "$scratch/launches.log" ] || {
  echo "launches.sh: cubecl logged no launches (did lab run on --backend $backend?)" >&2; exit 1; }

python3 - "$scratch/launches.log" <<'EOF'
import collections, sys
names = [line[len("Executing "):].split(" | ")[0]
         for line in map(str.strip, open(sys.argv[1])) if line.startswith("Executing ")]
# A step ends with the optimizer's run of AdamW launches (one per parameter), between which a
# strided gradient's copy may come (a gradient that is a view into a wider one, such as a
# concatenation's backward hands out): the last AdamW launch with no other in the 3 after it.
ends = [i for i, n in enumerate(names)
        if n == "AdamwKernel" and "AdamwKernel" not in names[i + 1:i + 4]]
steps, start = [], 0
for end in ends:
    steps.append(names[start:end + 1])
    start = end + 1
if len(steps) < 2:
    sys.exit(f"launches.sh: the log holds {len(steps)} whole steps; ask for more with --steps")
# The first is the warm-up (it also runs autotune's trials); the log's tail may be cut short
# at exit, so only steps whose AdamW run is as long as the warm-up's count.
params = steps[0].count("AdamwKernel")
timed = [s for s in steps[1:] if s.count("AdamwKernel") == params]
if not timed:
    sys.exit("launches.sh: no whole timed step in the log; ask for more with --steps")
if len({len(s) for s in timed}) > 1:
    print("launches.sh: the timed steps differ in length: the cut at AdamW may be wrong",
          file=sys.stderr)
print(f"launches per timed step: {[len(s) for s in timed]} ({params} AdamW launches each)")
print("the last one by kernel:")
for name, n in collections.Counter(timed[-1]).most_common():
    print(f"  {n:6d}  {name}")
EOF
