#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test moekit. Idempotent; prints
# nothing when everything is already there.
#   scripts/setup.sh            build + test dependencies (Debian packages)
#   scripts/setup.sh --goldens  also what tools/gen_*_goldens.py need to regenerate the frozen
#                               goldens: torch + numpy (Debian) and mlx + mlx-lm (PyPI, CPU) for
#                               /usr/bin/python3. The test suite itself never needs them.
set -euo pipefail
goldens=0
for arg in "$@"; do
  case "$arg" in
    --goldens) goldens=1 ;;
    *) echo "setup.sh: unknown option '$arg' (accepted: --goldens)" >&2; exit 2 ;;
  esac
done
pkgs=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev nlohmann-json3-dev libcli11-dev libopenblas-dev
      llvm python3-matplotlib)  # llvm: llvm-symbolizer, so sanitizer and fuzzer reports name functions and lines
if ((goldens)); then pkgs+=(python3 python3-pip python3-numpy python3-torch); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ((goldens)) && ! /usr/bin/python3 -c "import mlx.core, mlx_lm" 2>/dev/null; then
  echo "setup: installing mlx[cpu]==0.32.4 mlx-lm==0.32.2 for /usr/bin/python3"
  $SUDO /usr/bin/python3 -m pip install -q --break-system-packages "mlx[cpu]==0.32.4" "mlx-lm==0.32.2"
fi
