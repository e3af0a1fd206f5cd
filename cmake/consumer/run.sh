#!/usr/bin/env bash
# Installs the build tree $1 into a fresh prefix, then configures, builds and runs the consumer
# project against it with find_package(moekit CONFIG). Used by ctest (install.find_package).
set -euo pipefail
build="$1"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/lib/cmake/moekit/moekitConfig.cmake"
test -f "$work/prefix/lib/cmake/moekit/moekitConfigVersion.cmake"
cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
