#!/usr/bin/env bash
# Sets up kt-kernel (PyPI kt-kernel 0.7.2) in its own venv, build-peers/venv-kt: it pins torch
# 2.9.1 (with its CUDA wheels, ~7 GB), which must not replace the main venv's torch.
# On success prints the CPU variant kt-kernel loads here (amx, avx512_bf16, ..., avx2) on stdout;
# on failure prints "not measured: <reason>" and exits 1. Idempotent and quiet once done.
# Env: KT_KERNEL_VERSION (default 0.7.2), KT_KERNEL_CPU_VARIANT (override kt-kernel's own choice).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$ROOT/build-peers}"
VENV="$PEERS_DIR/venv-kt"
VERSION="${KT_KERNEL_VERSION:-0.7.2}"
STAMP="$VENV/.moekit-peers-stamp"

log() { echo "peers/kt: $*" >&2; }
fail() { log "$*"; echo "not measured: $*"; exit 1; }

if ! [[ -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION" ]]; then
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV" || fail "cannot create $VENV"
    log "installing kt-kernel==$VERSION from PyPI into $VENV (pins torch 2.9.1 + CUDA wheels, ~7 GB; minutes)"
    nice -n 19 "$VENV/bin/python" -m pip install -q "kt-kernel==$VERSION" >&2 ||
        fail "pip install kt-kernel==$VERSION failed"
    echo "$VERSION" > "$STAMP"
fi
# Which build of its extension kt-kernel loads on this CPU (its own /proc/cpuinfo detection, or
# KT_KERNEL_CPU_VARIANT); importing it also proves the install works without a GPU.
variant="$("$VENV/bin/python" -c 'import kt_kernel; print(kt_kernel.__cpu_variant__)' 2>"$VENV/import.log" | tail -n1)" ||
    fail "import kt_kernel failed: $(grep -v '^\s*$' "$VENV/import.log" | tail -n1)"
[[ -n "$variant" ]] || fail "import kt_kernel printed no CPU variant"
echo "$variant"
