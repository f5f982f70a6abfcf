#!/usr/bin/env bash
# A fresh Lambda or RunPod GPU host (Ubuntu 20.04/22.04/24.04, A100/H100) to a checked `lab`:
#
#   git clone <this repo> lab && cd lab && scripts/cloud/bootstrap.sh
#
# Idempotent: every step checks before it acts, so a second run only re-checks.
#   1. system packages a build needs (build-essential, pkg-config, git, curl);
#   2. the Rust toolchain (rustup, the version rust-toolchain/Cargo.toml asks for);
#   3. the GPU: nvidia-smi sees it, the driver's CUDA version, the toolkit headers cubecl
#      compiles its kernels against at run time (NVRTC);
#   4. `cargo build --release --features cuda` with CUDARC_CUDA_VERSION matching the driver;
#   5. a two-step `lab bench --backend cuda` on the tiny config as a smoke test;
# then prints the lab-00 command.
#
# The prebuilt path: build on any Linux machine with the same CUDARC_CUDA_VERSION as the
# host's driver (`nvidia-smi` prints "CUDA Version: 13.0" → 13000), copy target/release/lab,
# and run step 3 and 5 here with `LAB=/path/to/lab scripts/cloud/bootstrap.sh --no-build`.
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
build=1
[ "${1:-}" = "--no-build" ] && build=0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
say() { printf '\n== %s\n' "$*"; }

say "system packages"
need=()
for pkg in build-essential pkg-config git curl ca-certificates; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -q
  # `env`: as root $sudo is empty, and an assignment after an expansion is a command name.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
else
  echo "present"
fi

say "Rust toolchain"
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null; then
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
fi
want="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"
have="$(rustc --version | awk '{print $2}')"
if [ -n "$want" ] && [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
  rustup toolchain install stable --profile minimal && rustup default stable
fi
rustc --version

say "GPU"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  echo "bootstrap: nvidia-smi finds no GPU; this host cannot run --backend cuda" >&2
  exit 1
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
cuda_version="$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1)"
if [ -z "$cuda_version" ]; then
  if [ -z "${CUDARC_CUDA_VERSION:-}" ]; then
    echo "bootstrap: nvidia-smi prints no \"CUDA Version: X.Y\"; set CUDARC_CUDA_VERSION to the CUDA version the driver supports (12.8 -> 12080)" >&2
    exit 1
  fi
  case "$CUDARC_CUDA_VERSION" in ''|*[!0-9]*)
    echo "bootstrap: CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION: give it as digits (CUDA 12.8 -> 12080)" >&2
    exit 1 ;;
  esac
  cuda_version="$((CUDARC_CUDA_VERSION / 1000)) $((CUDARC_CUDA_VERSION % 1000 / 10))"
fi
read -r major minor <<<"$cuda_version"
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-$((major * 1000 + minor * 10))}"
echo "driver supports CUDA $major.$minor: CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION"
# The lookup lab itself makes (crates/train/src/backend.rs, cuda_headers): CUDA_PATH, else the
# first of /usr/local/cuda and /opt/cuda that exists, else /usr when the distro's nvcc is there.
cuda_root="${CUDA_PATH:-}"
for candidate in /usr/local/cuda /opt/cuda; do
  [ -z "$cuda_root" ] && [ -e "$candidate" ] && cuda_root="$candidate"
done
[ -z "$cuda_root" ] && [ -e /usr/bin/nvcc ] && cuda_root=/usr
if [ -z "$cuda_root" ] || [ ! -f "$cuda_root/include/cuda.h" ]; then
  # cubecl compiles its kernels at run time with NVRTC, which includes these headers.
  echo "bootstrap: no CUDA toolkit headers (cuda.h) under ${cuda_root:-CUDA_PATH, /usr/local/cuda, /opt/cuda or /usr}; install the toolkit for CUDA $major.$minor (apt: cuda-toolkit-${major}-${minor}) or set CUDA_PATH to it" >&2
  exit 1
fi
echo "CUDA toolkit: $cuda_root"

lab="${LAB:-$repo/target/release/lab}"
if [ "$build" = 1 ]; then
  say "build (cargo build --release --features cuda)"
  (cd "$repo" && cargo build --release -p lab@0.1.0 --features cuda)
fi
[ -x "$lab" ] || { echo "bootstrap: no lab binary at $lab" >&2; exit 1; }

say "smoke test: two bf16 steps of the tiny config on the GPU"
(cd "$repo" && "$lab" bench --backend cuda --config configs/tiny-cpu.toml --precision bf16 --steps 2 --warmup 1)

say "ready. Lab 00 (x1-50m on this GPU under the \$35 cap: spike drill, post-mortem, export, DoD, terminate):"
cat <<EOF
  cd $repo
  # FineWeb-Edu, GPT-2 tokenized, into the page's data dir first (README, "Data").
  $lab run configs/lab/lab00-a100.toml --dry-run   # what it will do
  $lab run configs/lab/lab00-a100.toml
EOF
