#!/usr/bin/env bash
# Set up, build and run the whole test suite. PRESET=asan|tsan|debug picks a sanitizer or
# debug build (default: the Release preset).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${PRESET:-default}"
scripts/setup.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" -j2 "$@"
