#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test moekit. Idempotent; prints
# nothing when everything is already there.
#   scripts/setup.sh            build + test dependencies (Debian packages), and .venv: a virtual
#                               environment of Debian's /usr/bin/python3 (it sees Debian's numpy
#                               and torch) with nanobind, scikit-build-core and pytest from PyPI,
#                               for the Python module and its tests
#   scripts/setup.sh --goldens  also mlx + mlx-lm (PyPI, CPU) and ml_dtypes for /usr/bin/python3: what
#                               tools/gen_*_goldens.py and the live mlx-lm oracle tests need.
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
      libpcre2-dev libicu-dev  # the tokenizers: PCRE2 for the pre-tokenizers' regexes, ICU for normalization
      llvm clang-format python3-matplotlib  # llvm: llvm-symbolizer, so sanitizer and fuzzer reports name functions and lines
      python3 python3-dev python3-venv python3-pip python3-numpy python3-torch
      openmpi-bin libopenmpi-dev iproute2)  # OpenMPI: the dist layer and its mpirun tests; iproute2: their netns hosts;
# clang-format: scripts/format_check.sh
# torch (Debian's 1.13) is the live autograd oracle of tools/gen_layer_goldens.py and the torch
# side of the Python module's tests.
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
# ml_dtypes decodes FP8 bytes for tools/gen_format_goldens.py; below 0.5, which would replace
# Debian's numpy 1.24 with numpy 2 and break Debian's torch.
if ((goldens)) && ! /usr/bin/python3 -c "import ml_dtypes" 2>/dev/null; then
  echo "setup: installing ml_dtypes==0.4.1 for /usr/bin/python3"
  $SUDO /usr/bin/python3 -m pip install -q --break-system-packages "ml_dtypes==0.4.1"
fi
# The Python module's build and test environment (CMake's default preset points at it).
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "setup: creating $root/.venv (/usr/bin/python3 with system site packages)"
  /usr/bin/python3 -m venv --system-site-packages "$root/.venv"
fi
if ! "$root/.venv/bin/python" -c "import nanobind, scikit_build_core, pytest, jinja2, openai" 2>/dev/null; then
  # jinja2: moekit.chat renders the models' chat templates with it (3.1.6: transformers' minimum);
  # openai: the client python/tests/test_serve.py runs against moekit.serve
  echo "setup: installing nanobind==3.1.0 scikit-build-core==1.1.2 pytest==9.2.0 jinja2==3.1.6 openai==3.63.0 into .venv"
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check \
    "nanobind==3.1.0" "scikit-build-core==1.1.2" "pytest==9.2.0" "jinja2==3.1.6" "openai==3.63.0"
fi
