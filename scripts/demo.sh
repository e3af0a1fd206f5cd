#!/usr/bin/env bash
# Set up, build (Release preset) and run moekit's main job on its embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default --target moekit_cli
exec build/bin/moekit demo "$@"
