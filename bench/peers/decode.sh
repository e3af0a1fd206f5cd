#!/usr/bin/env bash
# Decode at the memory limit, moekit against ggml's fair decode (bench/peers/ggml_decode.cpp) on
# this machine, in one run, one markdown table. Not a test; never in CI.
#
#   bench/peers/decode.sh [--formats 4-bit,MXFP4,8-bit,bf16,f32] [--tokens 1,2,4,8,32]
#                         [--threads 2] [--reps 5] [--rounds 3] [--out DIR] [--with-cached]
#
# --rounds: moekit, then ggml, this many times per format pair (medians and the ratio's range).
# --with-cached: also ggml's cached test-backend-ops figure (a ~10 minute llama.cpp build the first time).
# Env: MOEKIT_BIN (default build/bin/moekit), PEERS_DIR (default build-peers/).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export PEERS_DIR="${PEERS_DIR:-$ROOT/build-peers}"

formats="" tokens=1,2,4,8,32 threads=2 reps=5 rounds=3 out="" cached=0
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --formats) formats="$2"; shift ;;
        --tokens) tokens="$2"; shift ;;
        --threads) threads="$2"; shift ;;
        --reps) reps="$2"; shift ;;
        --rounds) rounds="$2"; shift ;;
        --out) out="$2"; shift ;;
        --with-cached) cached=1 ;;
        -h|--help) usage 0 ;;
        *) echo "decode.sh: unknown option '$1'" >&2; usage 2 >&2 ;;
    esac
    shift
done
out="${out:-$PEERS_DIR/results/decode-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
moekit="${MOEKIT_BIN:-$ROOT/build/bin/moekit}"
[[ -x "$moekit" ]] || { echo "decode.sh: no moekit binary at $moekit (set MOEKIT_BIN)" >&2; exit 1; }

args=(--moekit-bin "$moekit" --tokens "$tokens" --threads "$threads" --reps "$reps" --rounds "$rounds" --out "$out")
[[ -n $formats ]] && args+=(--formats "$formats")
if "$HERE/setup_ggml.sh" decode >/dev/null; then
    args+=(--ggml-decode "$PEERS_DIR/ggml/ggml_decode")
else
    echo "decode.sh: the ggml decode harness did not build; its columns will say so" >&2
fi
if [[ $cached == 1 ]] && "$HERE/setup_ggml.sh" >/dev/null; then
    args+=(--test-backend-ops "$PEERS_DIR/ggml/test-backend-ops")
fi
exec python3 "$HERE/decode.py" "${args[@]}"
