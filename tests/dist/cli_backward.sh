#!/usr/bin/env bash
# `mpirun -np N moekit backward --expert-parallel` against `moekit backward` in one process, on
# the layer goldens' float checkpoints and their grad_output (families with shared experts, a
# shared gate, biases, weight-on-input): at N = 1 the same file byte for byte; at N = 2..4 dx and
# every routed expert's gradient the same bytes and the router and shared-expert gradients within
# 1e-5 of max |g| (compare_grads.py: they are sums over the ranks, docs/distributed.md). Scattered
# placements give the contiguous placement's bytes at the same N, and --recompute the kept
# pre-activations' bytes. Then failures end every rank within the timeout with one message and
# leave no file behind.
# Usage: cli_backward.sh MOEKIT_BIN MPIEXEC GOLDENS_DIR
set -euo pipefail
bin="$1" mpiexec="$2" goldens="$3"
here="$(dirname "$0")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

source "$here/cli_lib.sh"

# backward_ep NP OUTPUT CASE [OPTIONS...]: the expert-parallel backward of golden CASE.
backward_ep() {
  local np="$1" out="$2" case="$3"
  shift 3
  timeout 120 "$mpiexec" -np "$np" --oversubscribe "$bin" backward --expert-parallel --model "$goldens/$case" \
    --layer "$(layer_of "$case")" --input "$goldens/$case/input.npy" \
    --grad-output "$goldens/$case/grad/grad_output.npy" --output "$out" "$@"
}

same_bytes() {  # same_bytes WANT GOT WHAT
  cmp -s "$1" "$2" || { echo "FAIL: $3: not the same bytes" >&2; exit 1; }
}

checked=0
for case in deepseek_v3 mixtral gpt_oss llama4_text qwen2_moe; do
  dir="$goldens/$case"
  [[ -f "$dir/grad/grad_output.npy" ]] || { echo "no golden $case" >&2; exit 1; }
  "$bin" backward --model "$dir" --layer "$(layer_of "$case")" --input "$dir/input.npy" \
    --grad-output "$dir/grad/grad_output.npy" --output "$work/g1.safetensors"
  for np in 1 2 3 4; do
    backward_ep "$np" "$work/g.safetensors" "$case"
    if [[ $np -eq 1 ]]; then
      same_bytes "$work/g1.safetensors" "$work/g.safetensors" "$case np=1"
    else
      echo -n "$case np=$np: "
      /usr/bin/python3 "$here/compare_grads.py" "$work/g1.safetensors" "$work/g.safetensors" 1e-5
    fi
    checked=$((checked + 1))
  done
  echo "ok: $case, np = 1..4: the single-process gradients (bytes at np = 1; dx and experts bytes at 2..4)"
done

# A quantized checkpoint: the gradients of its decoded weights, expert-parallel as in one process.
"$bin" quantize --model "$goldens/deepseek_v3" --out "$work/quantized" --bits 4 --group-size 32 >/dev/null
qargs=(--model "$work/quantized" --layer "$(layer_of deepseek_v3)" --input "$goldens/deepseek_v3/input.npy"
  --grad-output "$goldens/deepseek_v3/grad/grad_output.npy")
"$bin" backward "${qargs[@]}" --output "$work/q1.safetensors"
timeout 120 "$mpiexec" -np 1 --oversubscribe "$bin" backward --expert-parallel "${qargs[@]}" --output "$work/q.safetensors"
same_bytes "$work/q1.safetensors" "$work/q.safetensors" "quantized deepseek_v3 np=1"
timeout 120 "$mpiexec" -np 2 --oversubscribe "$bin" backward --expert-parallel "${qargs[@]}" --output "$work/q.safetensors"
echo -n "quantized deepseek_v3 np=2: "
/usr/bin/python3 "$here/compare_grads.py" "$work/q1.safetensors" "$work/q.safetensors" 1e-5
checked=$((checked + 2))

# Placements and --recompute change neither the rows an expert sees nor the token slices whose
# partial sums are added: the same bytes as the contiguous run at the same rank count.
for case in deepseek_v3 gpt_oss; do
  E="$(experts_of "$case")"
  python3 -c "print(',\n'.join(['2'] * $E))" >"$work/owners.txt"  # ranks 0 and 1 own none
  backward_ep 3 "$work/g3.safetensors" "$case"
  for placement in "$(scattered_placement "$E" 3)" "@$work/owners.txt"; do
    backward_ep 3 "$work/g.safetensors" "$case" --placement "$placement"
    same_bytes "$work/g3.safetensors" "$work/g.safetensors" "$case np=3 --placement $placement"
    checked=$((checked + 1))
  done
  backward_ep 3 "$work/g.safetensors" "$case" --recompute --placement "$(scattered_placement "$E" 3)"
  same_bytes "$work/g3.safetensors" "$work/g.safetensors" "$case np=3 --recompute"
  checked=$((checked + 1))
  echo "ok: $case, np = 3: scattered placements (list, @FILE) and --recompute give the contiguous run's bytes"
done

dir="$goldens/deepseek_v3"
out="$work/fail/g.safetensors"
mkdir -p "$work/fail"
args=(--layer 1 --output "$out")
expect_failure "a missing input" "missing.npy" backward --model "$dir" --input "$work/missing.npy" \
  --grad-output "$dir/grad/grad_output.npy" "${args[@]}"
expect_failure "a missing grad-output" "nothing.npy" backward --model "$dir" --input "$dir/input.npy" \
  --grad-output "$work/nothing.npy" "${args[@]}"
/usr/bin/python3 - "$dir/grad/grad_output.npy" "$work/short.npy" <<'PY'
import sys
import numpy as np
np.save(sys.argv[2], np.load(sys.argv[1])[:-1])
PY
expect_failure "a grad-output of another shape" "grad-output '.*short.npy' has shape" backward --model "$dir" \
  --input "$dir/input.npy" --grad-output "$work/short.npy" "${args[@]}"
expect_failure "a placement of the wrong length" "lists 2 owners" backward --placement 0,1 --model "$dir" \
  --input "$dir/input.npy" --grad-output "$dir/grad/grad_output.npy" "${args[@]}"
expect_failure "an output in a missing folder" "no/such" backward --model "$dir" --input "$dir/input.npy" \
  --grad-output "$dir/grad/grad_output.npy" --layer 1 --output "$work/no/such/g.safetensors"
leftover="$(ls -A "$work/fail")"
[[ -z "$leftover" ]] || { echo "FAIL: the failed runs left files behind: $leftover" >&2; exit 1; }
echo "cli_backward: $checked mpirun runs equal to one process; 5 failures ended cleanly, writing nothing"
