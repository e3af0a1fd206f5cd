#!/usr/bin/env bash
# One command: moekit against its peers (torch + transformers, ggml, optionally kt-kernel) on this
# machine, in one run, with the machine's limits measured in the same run. Not a test; never in CI.
#
#   bench/peers/run.sh [--quick] [--shapes qwen3,deepseek] [--tokens 1,32,512] [--threads 2]
#                      [--reps 5] [--out DIR] [--with-kt] [--skip-ggml] [--call-budget-s 30]
#
# --quick: T = 1,32 and 2 timed calls per row (a smoke run; --tokens/--reps still override).
# Env: MOEKIT_BIN (default build/bin/moekit), PEERS_DIR (default build-peers/), KT_KERNEL_CPU_VARIANT.
# Setup (venv, ggml build, kt venv) is idempotent and silent once done; see bench/peers/README.md.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export PEERS_DIR="${PEERS_DIR:-$ROOT/build-peers}"

quick=0 shapes=qwen3,deepseek tokens="" threads=2 reps="" out="" with_kt=0 skip_ggml=0 budget=30
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) quick=1 ;;
        --shapes) shapes="$2"; shift ;;
        --tokens) tokens="$2"; shift ;;
        --threads) threads="$2"; shift ;;
        --reps) reps="$2"; shift ;;
        --out) out="$2"; shift ;;
        --with-kt) with_kt=1 ;;
        --skip-ggml) skip_ggml=1 ;;
        --call-budget-s) budget="$2"; shift ;;
        -h|--help) usage 0 ;;
        *) echo "run.sh: unknown option '$1'" >&2; usage 2 >&2 ;;
    esac
    shift
done
if [[ $quick == 1 ]]; then tokens="${tokens:-1,32}"; reps="${reps:-2}"; fi
tokens="${tokens:-1,32,512}"; reps="${reps:-5}"
out="${out:-$PEERS_DIR/results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

moekit="${MOEKIT_BIN:-$ROOT/build/bin/moekit}"
[[ -x "$moekit" ]] || echo "run.sh: no moekit binary at $moekit (set MOEKIT_BIN); its rows will say so" >&2

# 1. The venv (numpy, torch, transformers, matplotlib). Without it the report still comes, from the
#    system python3, with the torch rows "not measured".
py=python3 venv_python="" venv_status=""
if "$HERE/setup.sh" 2> >(tee "$out/setup-venv.log" >&2); then
    venv_python="$PEERS_DIR/venv/bin/python"; py="$venv_python"
else
    venv_status="venv setup failed (see $out/setup-venv.log)"
    echo "run.sh: $venv_status" >&2
fi

# 2. ggml's test-backend-ops (a ~10 minute build the first time on 2 cores).
ggml_bin="" ggml_status="" ggml_version=""
if [[ $skip_ggml == 1 ]]; then
    ggml_status="skipped (--skip-ggml)"
elif ggml_status="$("$HERE/setup_ggml.sh")"; then
    ggml_bin="$PEERS_DIR/ggml/test-backend-ops"; ggml_status=""
    ggml_version="$(cat "$PEERS_DIR/ggml/VERSION")"
else
    ggml_status="${ggml_status#not measured: }"; ggml_status="${ggml_status:-setup_ggml.sh failed}"
fi

# 3. kt-kernel, only when asked (a separate ~7 GB venv: it pins its own torch).
kt_python="" kt_status="" kt_variant=""
if [[ $with_kt == 1 ]]; then
    if kt_status="$("$HERE/setup_kt.sh")"; then
        kt_python="$PEERS_DIR/venv-kt/bin/python"; kt_variant="$kt_status"; kt_status=""
    else
        kt_status="${kt_status#not measured: }"; kt_status="${kt_status:-setup_kt.sh failed}"
    fi
fi

args=(--shapes "$shapes" --tokens "$tokens" --threads "$threads" --reps "$reps" --out "$out"
      --moekit-bin "$moekit" --venv-python "$venv_python" --venv-status "$venv_status"
      --ggml-bin "$ggml_bin" --ggml-status "$ggml_status" --ggml-version "$ggml_version"
      --call-budget-s "$budget")
[[ $quick == 1 ]] && args+=(--quick)
[[ $with_kt == 1 ]] && args+=(--with-kt --kt-python "$kt_python" --kt-status "$kt_status"
                              --kt-variant "$kt_variant")
exec "$py" "$HERE/peers.py" "${args[@]}"
