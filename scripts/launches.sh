#!/usr/bin/env bash
# How many GPU kernels a training step launches, by kernel: the host's share of a step grows
# with this count (each launch costs the host microseconds, whatever the kernel's size). With
# --times, also how long each kernel ran: where a step's device time goes.
#
#   scripts/launches.sh --lab PATH --config FILE [--backend wgpu|cuda] [--steps N] [--times]
#
# Runs `lab bench` (one warm-up step, then N, default 2) in a scratch folder whose cubecl.toml
# turns on cubecl's launch log (profiling level "minimal": each launch's name, no timing, no
# waits), cuts the log into steps at the optimizer's last AdamW launch, and prints the launches
# of each timed step and, for the last one, their count by kernel. The difference between
# configs with grad_accum 1 and 2 is what one more micro-batch launches.
# Only cubecl's launches are logged: on CUDA the products cuBLASLt runs (LAB_MATMUL=cublaslt)
# are not counted, and a cubecl.toml takes the place of lab's kernel cache, so every kernel
# compiles again.
#
# --times: cubecl's profiler instead (CUBECL_DEBUG_LOG and CUBECL_DEBUG_OPTION=profile-full, no
# cubecl.toml, so on CUDA lab's kernel cache still applies): each launch waits for the device
# before and after. On CUDA its time is the host's between the two, so a kernel's figure
# includes a launch and a sync (microseconds); wgpu reads the device's timestamps where it has
# them. The step runs slower than in training. The same log takes cubecl's compilation and
# autotune logs too (on a fresh host, every kernel's source); only timed launches are read.
# Prints, per timed step on average, each kernel's launches, milliseconds and share of the
# kernels' sum, by kernel path (lab_kernels::rms_norm::ForwardKernel and
# lab_kernels::attention::ForwardKernel apart); every product cubecl runs is one `MatmulEntry`
# line whatever its shape (`lab bench --matmul` times them by shape).
set -euo pipefail
lab="" config="" backend=wgpu steps=2 times=0
while [ $# -gt 0 ]; do
  if [ "$1" = --times ]; then times=1; shift; continue; fi
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
log="$scratch/launches.log"
if [ "$times" = 1 ]; then
  (cd "$scratch" && CUBECL_DEBUG_LOG="$log" CUBECL_DEBUG_OPTION=profile-full \
    "$lab" bench --backend "$backend" --config "$config" --steps "$steps" --warmup 1 >&2)
else
  cat > "$scratch/cubecl.toml" <<EOF
[profiling.logger]
level = "minimal"
file = '$log'
append = false
EOF
  (cd "$scratch" && "$lab" bench --backend "$backend" --config "$config" --steps "$steps" \
    --warmup 1 >&2)
fi
[ -s "$log" ] || {
  echo "launches.sh: cubecl logged no launches (did lab run on --backend $backend?)" >&2; exit 1; }

python3 - "$log" "$times" <<'EOF'
import collections, re, sys
log, times = sys.argv[1], sys.argv[2] == "1"

def seconds(text):
    """A Rust Duration as Debug prints it (850ns, 12.5µs, 3.2ms, 1.02s), in seconds."""
    m = re.fullmatch(r"([0-9.]+)(ns|µs|ms|s)", text)
    return m and float(m[1]) * {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[m[2]]

def label(path):
    """A kernel's type path, short: lab's kernels keep their module (rms_norm's and the
    attention's ForwardKernel are two kernels), others only their crate."""
    parts = path.split("::")
    if parts[0] == "lab_kernels" and len(parts) > 2:
        return f"{parts[0]}::{parts[1]}::{parts[-1]}"
    return f"{parts[0]}::{parts[-1]}" if len(parts) > 1 else path

# (kernel, seconds or None) per launch, in launch order.
launches = []
for line in open(log, encoding="utf-8", errors="replace"):
    if times:
        m = re.match(r"\| (\S+)\s*\| (.+)", line)
        if m and seconds(m[1]) is not None:
            path = re.split(r"<|: ", m[2].strip(), maxsplit=1)[0]
            launches.append((label(path), seconds(m[1])))
    elif line.startswith("Executing "):
        launches.append((line[len("Executing "):].split(" | ")[0].strip(), None))
if not launches:
    sys.exit("launches.sh: no launches in cubecl's log")

def is_adamw(name):
    return name.endswith("AdamwKernel")

names = [name for name, _ in launches]

# A step ends with the optimizer's run of AdamW launches (one per parameter), between which a
# strided gradient's copy may come (a gradient that is a view into a wider one, such as a
# concatenation's backward hands out): the last AdamW launch with no other in the 3 after it.
ends = [i for i, name in enumerate(names)
        if is_adamw(name) and not any(map(is_adamw, names[i + 1:i + 4]))]
steps, start = [], 0
for end in ends:
    steps.append(launches[start:end + 1])
    start = end + 1
if len(steps) < 2:
    sys.exit(f"launches.sh: the log holds {len(steps)} whole steps; ask for more with --steps")
# The first is the warm-up (it also runs autotune's trials); the log's tail may be cut short
# at exit, so only steps whose AdamW run is as long as the warm-up's count.
def adamw_count(step):
    return sum(is_adamw(name) for name, _ in step)
params = adamw_count(steps[0])
timed = [s for s in steps[1:] if adamw_count(s) == params]
if not timed:
    sys.exit("launches.sh: no whole timed step in the log; ask for more with --steps")
if len({len(s) for s in timed}) > 1:
    print("launches.sh: the timed steps differ in length: the cut at AdamW may be wrong",
          file=sys.stderr)
print(f"launches per timed step: {[len(s) for s in timed]} ({params} AdamW launches each)")
if not times:
    print("the last one by kernel:")
    for name, n in collections.Counter(name for name, _ in timed[-1]).most_common():
        print(f"  {n:6d}  {name}")
    sys.exit()
count, spent = collections.Counter(), collections.Counter()
for step in timed:
    for name, s in step:
        count[name] += 1
        spent[name] += s
total = sum(spent.values())
n = len(timed)
print(f"kernel time per timed step: {1e3 * total / n:.2f} ms (mean of {n}; each launch timed "
      "from a sync before it to one after)")
print(f"  {'launches':>8}  {'ms':>9}  {'share':>6}  kernel")
for name, s in spent.most_common():
    print(f"  {count[name] / n:8.1f}  {1e3 * s / n:9.3f}  {100 * s / total:5.1f}%  {name}")
EOF
