#!/usr/bin/env bash
# Sets up the Python venv of the peer benchmark: build-peers/venv with numpy, torch, transformers 5.x,
# matplotlib and threadpoolctl (to tell which BLAS kernel numpy runs), from PyPI only.
# Idempotent: when the venv already imports all of them at the pinned set it prints nothing.
# Usage: bench/peers/setup.sh   (env: PEERS_DIR, default build-peers/ at the repository root)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$ROOT/build-peers}"
VENV="$PEERS_DIR/venv"
mkdir -p "$PEERS_DIR"

log() { echo "peers/setup: $*" >&2; }

# The pins live here, in one place; the stamp file records the set that was installed, so a change
# of pins reinstalls and an unchanged set costs one import check.
REQS=(numpy torch 'transformers>=5,<6' matplotlib threadpoolctl)
STAMP="$VENV/.moekit-peers-stamp"
WANT="${REQS[*]}"

venv_ok() {
    [[ -x "$VENV/bin/python" ]] && [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$WANT" ]] &&
        "$VENV/bin/python" -c 'import numpy, torch, transformers, matplotlib, threadpoolctl' 2>/dev/null
}
venv_ok && exit 0

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 ships venv/ensurepip separately.
        log "python3 -m venv failed; installing python3-venv from Debian"
        rm -rf "$VENV"
        (apt-get update -qq && nice -n 19 apt-get install -y -qq python3-venv) >&2
        python3 -m venv "$VENV"
    fi
fi

log "installing ${REQS[*]} from PyPI into $VENV (torch's default PyPI wheel is large; minutes)"
# nice: the machine is shared with builds and benchmarks of moekit.
nice -n 19 "$VENV/bin/python" -m pip install -q --upgrade pip >&2
if ! nice -n 19 "$VENV/bin/python" -m pip install -q "${REQS[@]}" >&2; then
    log "pip install failed"
    exit 1
fi
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "matplotlib from PyPI does not import; trying Debian's python3-matplotlib (chart only)"
    (apt-get update -qq && nice -n 19 apt-get install -y -qq python3-matplotlib) >&2 || true
fi
echo "$WANT" > "$STAMP"
log "venv ready: $("$VENV/bin/python" -c 'import torch, transformers, numpy; print("torch", torch.__version__, "transformers", transformers.__version__, "numpy", numpy.__version__)')"
