#!/usr/bin/env bash
# Builds, on a machine with Rust, what a GPU session carries to the device (the call's
# `carry: [".bin"]`; .bin/ is git-ignored):
#
#   .bin/lab.xz            lab --features cuda, stripped and compressed
#   .bin/nccl-test         lab-dist's NCCL test (issue 13's world-of-one check)
#   .bin/tests/kernels.xz  lab-kernels' GPU tests (tests/main.rs), --features cuda
#   .bin/tests/ops.xz      lab-ops' GPU tests, --features cuda (projections on cuBLASLt)
#   .bin/tests/model.xz    lab-model's GPU tests, --features cuda (the planner's activation
#                          count against the GPU's pool, bf16 included)
#   .bin/BUILT             the commit they were built from
#
# then checks that the whole fits the 64 MiB a device call carries. scripts/gpu/session.sh
# unpacks them there. CUDA is loaded at run time, so no toolkit is needed here; the binaries
# are built for the lent hosts' CUDA 13.0 unless CUDARC_CUDA_VERSION says otherwise.
#
#   scripts/gpu/build.sh [--out DIR]     (default .bin)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.bin
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
    *) echo "build.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "build.sh: --out needs a folder" >&2; exit 2; }
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
# A clean slate for the files this script writes, and only those: a binary left unpacked
# beside an older build (session.sh unpacks next to the .xz, and skips what is already
# there) would run instead of the new one.
rm -f "$out"/{lab,lab.xz,nccl-test,BUILT} "$out"/tests/{kernels,ops,model}{,.xz}
mkdir -p "$out/tests"
# What is built, stamped before cargo starts: the commit, and whether the tree differs from it
# (untracked files included). session.sh prints it first, so a later session can tell whether
# the folder is current.
built="$(git rev-parse --short HEAD)$([ -z "$(git status --porcelain)" ] || echo ' + uncommitted changes'), built $(date -u +%FT%TZ), CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION"

# The executable of target NAME in a `cargo … --message-format=json` build's messages on
# stdin; fails in one line when the build made none.
executable() {
  python3 -c '
import json, sys
name = sys.argv[1]
paths = [m["executable"] for m in map(json.loads, sys.stdin)
         if m.get("reason") == "compiler-artifact" and m.get("executable")
         and m["target"]["name"] == name]
if not paths:
    sys.exit(f"build.sh: cargo built no {name} test binary")
print(paths[-1])' "$1"
}

# Strips BINARY into DEST and compresses it to DEST.xz (xz's default level, both cores).
pack() {
  strip -o "$2" "$1"
  xz -T2 -f "$2"
}

echo "== lab --features cuda"
cargo build --release -p lab@0.1.0 --features cuda
pack target/release/lab "$out/lab"

echo "== lab-dist's NCCL test"
nccl="$(cargo test --release -p lab-dist --features cuda --test nccl --no-run \
  --message-format=json | executable nccl)"
strip -o "$out/nccl-test" "$nccl"

echo "== the GPU tests (lab-kernels, lab-ops, lab-model; --features cuda)"
messages="$(cargo test --release -p lab-kernels -p lab-ops -p lab-model \
  --features lab-kernels/cuda,lab-ops/cuda,lab-model/cuda \
  --test kernels --test ops --test model --no-run --message-format=json)"
for name in kernels ops model; do
  binary="$(executable "$name" <<< "$messages")"
  pack "$binary" "$out/tests/$name"
done

echo "$built" > "$out/BUILT"
echo "build.sh: $built"

total=$(du -cb "$out" | tail -1 | cut -f1)
ls -l "$out" "$out/tests"
echo "build.sh: $((total / 1024 / 1024)) MiB in $out (a device call carries 64 MiB with the tree)"
[ "$total" -lt $((56 * 1024 * 1024)) ] || {
  echo "build.sh: $out is over 56 MiB, too close to the 64 MiB a call carries with the working tree" >&2
  exit 1
}
