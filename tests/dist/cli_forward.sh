#!/usr/bin/env bash
# `mpirun -np N moekit forward --expert-parallel` against `moekit forward` in one process, on
# the layer goldens' checkpoints (several families, sharded and bf16 ones included) and the
# released weight formats' goldens (FP8, int4, MXFP4, NVFP4): y, ids and
# weights must be the same bytes, with the default placement and with scattered ones given as a
# list and as @FILE (ranks owning no experts included). Then failures: a bad input on rank 0's
# side, a missing checkpoint and bad placements end every rank within the timeout, with exit 1
# and the message printed once.
# Usage: cli_forward.sh MOEKIT_BIN MPIEXEC GOLDENS_DIR
set -euo pipefail
bin="$1" mpiexec="$2" goldens="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

source "$(dirname "$0")/cli_lib.sh"

checked=0
# same_as_one_process LABEL DIR LAYER INPUT NP...: y, ids and weights of forward --expert-parallel
# at each rank count NP equal the single-process run's bytes.
same_as_one_process() {
  local label="$1" dir="$2" layer="$3" input="$4"
  shift 4
  [[ -f "$dir/config.json" ]] || { echo "no golden $label" >&2; exit 1; }
  "$bin" forward --model "$dir" --layer "$layer" --input "$input" --output "$work/y1.npy" \
    --ids-out "$work/i1.npy" --weights-out "$work/w1.npy"
  for np in "$@"; do
    timeout 120 "$mpiexec" -np "$np" --oversubscribe "$bin" forward --expert-parallel --model "$dir" \
      --layer "$layer" --input "$input" --output "$work/y.npy" --ids-out "$work/i.npy" --weights-out "$work/w.npy"
    for f in y i w; do
      cmp -s "$work/${f}1.npy" "$work/$f.npy" || { echo "FAIL: $label np=$np: $f differs from one process" >&2; exit 1; }
    done
    checked=$((checked + 1))
  done
  echo "ok: $label, np = $*: y, ids and weights equal the single-process run byte for byte"
}

for case in deepseek_v3 gpt_oss llama4_text mixtral glm4_moe_sharded deepseek_v3_bf16; do
  input="$goldens/$case/input.npy"
  [[ -f "$input" ]] || input="$goldens/$case/torch_bf16/input.npy"
  same_as_one_process "$case" "$goldens/$case" "$(layer_of "$case")" "$input" 1 2 3 4
done

# The released weight formats, computed in place on every rank: FP8 block-scaled (128 × 128,
# ragged edges) and per channel, compressed-tensors int4, MXFP4 as GPT-OSS ships it, mlx's nvfp4.
for rel in formats/fp8_deepseek_v3 formats/fp8_channel_qwen3 formats/int4_kimi_k2 formats/int4_asym_qwen3 formats/mxfp4_gpt_oss \
  quantized/qwen3_moe_nvfp4; do
  same_as_one_process "$rel" "$goldens/../$rel" 1 "$goldens/../$rel/input.npy" 2 3
done

# The placement moves experts, never the order of an expert's rows: the same bytes.
for case in deepseek_v3 mixtral; do
  dir="$goldens/$case"
  layer="$(layer_of "$case")"
  E="$(experts_of "$case")"
  "$bin" forward --model "$dir" --layer "$layer" --input "$dir/input.npy" --output "$work/y1.npy" \
    --ids-out "$work/i1.npy" --weights-out "$work/w1.npy"
  python3 -c "print(',\n'.join(['1'] * $E))" >"$work/owners.txt"  # one a line; ranks 0 and 2 own none
  for spec in "3 $(scattered_placement "$E" 3)" "4 $(scattered_placement "$E" 4)" "3 @$work/owners.txt"; do
    np="${spec%% *}" placement="${spec#* }"
    timeout 120 "$mpiexec" -np "$np" --oversubscribe "$bin" forward --expert-parallel --placement "$placement" \
      --model "$dir" --layer "$layer" --input "$dir/input.npy" --output "$work/y.npy" --ids-out "$work/i.npy" \
      --weights-out "$work/w.npy"
    for f in y i w; do
      cmp -s "$work/${f}1.npy" "$work/$f.npy" ||
        { echo "FAIL: $case np=$np --placement $placement: $f differs from one process" >&2; exit 1; }
    done
    checked=$((checked + 1))
  done
  echo "ok: $case, placements scattered over 3 and 4 ranks and all on rank 1 (@FILE): the same bytes"
done

dir="$goldens/deepseek_v3"
expect_failure "a missing input" "missing.npy" forward --model "$dir" --layer 1 --input "$work/missing.npy" --output "$work/y.npy"
expect_failure "a missing checkpoint" "nowhere" forward --model "$work/nowhere" --layer 1 --input "$dir/input.npy" --output "$work/y.npy"
expect_failure "an output in a missing folder" "no/such" forward --model "$dir" --layer 1 --input "$dir/input.npy" --output "$work/no/such/y.npy"
/usr/bin/python3 - "$work/bad.npy" <<'PY'
import sys
import numpy as np
x = np.zeros((5, 32), np.float32); x[3, 7] = np.nan; np.save(sys.argv[1], x)
PY
expect_failure "a NaN in the input" "non-finite" forward --model "$dir" --layer 1 --input "$work/bad.npy" --output "$work/y.npy"
args=(--model "$dir" --layer 1 --input "$dir/input.npy" --output "$work/y.npy")
expect_failure "a placement of the wrong length" "lists 3 owners, but the layer has 16" forward --placement 0,1,2 "${args[@]}"
expect_failure "a placement naming rank 3 of 3" "owner of expert 15 is rank 3" forward \
  --placement "$(scattered_placement 15 3),3" "${args[@]}"
expect_failure "a placement entry that is not a rank" "entry 1 ('x')" forward --placement "0,x,$(scattered_placement 14 3)" \
  "${args[@]}"
expect_failure "a missing placement file" "cannot read the file" forward --placement "@$work/none.txt" "${args[@]}"
echo "cli_forward: $checked mpirun runs equal to one process; 8 failures ended cleanly"
