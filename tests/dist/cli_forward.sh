#!/usr/bin/env bash
# `mpirun -np N moekit forward --expert-parallel` against `moekit forward` in one process, on
# the layer goldens' checkpoints (several families, sharded and bf16 ones included): y, ids and
# weights must be the same bytes. Then failures: a bad input on rank 0's side and a missing
# checkpoint end every rank within the timeout, with exit 1 and the message printed once.
# Usage: cli_forward.sh MOEKIT_BIN MPIEXEC GOLDENS_DIR
set -euo pipefail
bin="$1" mpiexec="$2" goldens="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

layer_of() { python3 -c "import json,sys; m=json.load(open('$goldens/manifest.json')); print([c['layer'] for c in m['cases'] if c['dir']=='$1'][0])"; }

checked=0
for case in deepseek_v3 gpt_oss llama4_text mixtral glm4_moe_sharded deepseek_v3_bf16; do
  dir="$goldens/$case"
  [[ -f "$dir/config.json" ]] || { echo "no golden $case" >&2; exit 1; }
  input="$dir/input.npy"
  [[ -f "$input" ]] || input="$dir/torch_bf16/input.npy"
  layer="$(layer_of "$case")"
  "$bin" forward --model "$dir" --layer "$layer" --input "$input" --output "$work/y1.npy" \
    --ids-out "$work/i1.npy" --weights-out "$work/w1.npy"
  for np in 1 2 3 4; do
    timeout 120 "$mpiexec" -np "$np" --oversubscribe "$bin" forward --expert-parallel --model "$dir" \
      --layer "$layer" --input "$input" --output "$work/y.npy" --ids-out "$work/i.npy" --weights-out "$work/w.npy"
    for f in y i w; do
      cmp -s "$work/${f}1.npy" "$work/$f.npy" || { echo "FAIL: $case np=$np: $f differs from one process" >&2; exit 1; }
    done
    checked=$((checked + 1))
  done
  echo "ok: $case, np = 1..4: y, ids and weights equal the single-process run byte for byte"
done

expect_failure() {  # expect_failure NAME PATTERN ARGS...
  local name="$1" pattern="$2"
  shift 2
  local start=$SECONDS rc=0
  timeout 60 "$mpiexec" -np 3 --oversubscribe "$bin" forward --expert-parallel "$@" >"$work/out" 2>"$work/err" || rc=$?
  local took=$((SECONDS - start))
  [[ $rc -ne 0 && $rc -ne 124 ]] || { echo "FAIL: $name: exit $rc (124: timed out)" >&2; cat "$work/err" >&2; exit 1; }
  local n
  n=$(grep -c "moekit: error:" "$work/err" || true)
  [[ $n -eq 1 ]] || { echo "FAIL: $name: the error was printed $n times" >&2; cat "$work/err" >&2; exit 1; }
  grep -q -- "$pattern" "$work/err" || { echo "FAIL: $name: no '$pattern' in the message" >&2; cat "$work/err" >&2; exit 1; }
  echo "ok: $name ended in ${took}s with one message: $(grep 'moekit: error:' "$work/err")"
}
dir="$goldens/deepseek_v3"
expect_failure "a missing input" "missing.npy" --model "$dir" --layer 1 --input "$work/missing.npy" --output "$work/y.npy"
expect_failure "a missing checkpoint" "nowhere" --model "$work/nowhere" --layer 1 --input "$dir/input.npy" --output "$work/y.npy"
expect_failure "an output in a missing folder" "no/such" --model "$dir" --layer 1 --input "$dir/input.npy" --output "$work/no/such/y.npy"
/usr/bin/python3 - "$work/bad.npy" <<'PY'
import sys
import numpy as np
x = np.zeros((5, 32), np.float32); x[3, 7] = np.nan; np.save(sys.argv[1], x)
PY
expect_failure "a NaN in the input" "non-finite" --model "$dir" --layer 1 --input "$work/bad.npy" --output "$work/y.npy"
echo "cli_forward: $checked mpirun runs equal to one process; 4 failures ended cleanly"
