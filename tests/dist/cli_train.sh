#!/usr/bin/env bash
# `mpirun -np N moekit train --expert-parallel` against `moekit train` in one process, on a small
# model of three families (shared experts with loss-free balancing; expert biases with the
# sequence-wise aux loss; micro-batches with the Switch aux loss and z-loss): at N = 1 the same
# metrics (every CSV column but tokens/s) and the same checkpoint bytes; at N = 2, 3 the losses
# and gradient norm within 2e-5 (fp32 rounding of the sums over the ranks), the load metrics and
# the bias range exactly, and the checkpoint (experts gathered to rank 0) within 1e-4 (compare_train.py).
# A run stopped and resumed from its checkpoint continues the uninterrupted run's bits, also at
# another rank count's tolerance. Failures end every rank within the timeout with one message.
# Usage: cli_train.sh MOEKIT_BIN MPIEXEC
set -euo pipefail
bin="$1" mpiexec="$2"
here="$(dirname "$0")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
goldens="" # (cli_lib.sh's golden helpers are not used here)
source "$here/cli_lib.sh"
compare="$here/compare_train.py"

# A text the runs read (bytes of this repository's sources: real text, a few hundred KB).
cat "$here"/*.cpp "$here"/*.sh >"$work/text.txt"
base=(--data "$work/text.txt" --layers 2 --dim 32 --experts 8 --top-k 2 --expert-width 16 --context 4
      --steps 6 --batch-tokens 768 --seq-len 64 --eval-every 3 --eval-tokens 1536 --warmup 2 --seed 7 --threads 1)

train_ep() {  # train_ep NP ARGS...
  local np="$1"
  shift
  timeout 300 "$mpiexec" -np "$np" --oversubscribe "$bin" train --expert-parallel "$@" >"$work/ep.log" 2>&1 ||
    { echo "FAIL: mpirun -np $np moekit train --expert-parallel $*" >&2; cat "$work/ep.log" >&2; exit 1; }
}

for variant in "deepseek_v3 --balance loss_free_sign" \
               "gpt_oss --balance seq_aux --aux-coef 0.01" \
               "qwen2_moe --balance aux --aux-coef 0.01 --z-loss 0.001 --micro-batches 2"; do
  read -r family opts <<<"$variant"
  read -r -a extra <<<"$opts"
  args=("${base[@]}" --family "$family" "${extra[@]}")
  "$bin" train "${args[@]}" --csv "$work/one.csv" --save "$work/one" >/dev/null
  for np in 1 2 3; do
    rm -rf "$work/ep"
    train_ep "$np" "${args[@]}" --csv "$work/ep.csv" --save "$work/ep"
    if [[ $np -eq 1 ]]; then
      echo -n "$family np=1 metrics: "; /usr/bin/python3 "$compare" csv "$work/one.csv" "$work/ep.csv" exact
      for f in model.safetensors training_state.moekit; do
        echo -n "$family np=1 $f: "; /usr/bin/python3 "$compare" ckpt "$work/one/$f" "$work/ep/$f" 0
      done
    else
      echo -n "$family np=$np metrics: "; /usr/bin/python3 "$compare" csv "$work/one.csv" "$work/ep.csv" close
      echo -n "$family np=$np model: "; /usr/bin/python3 "$compare" ckpt "$work/one/model.safetensors" "$work/ep/model.safetensors" 1e-4
    fi
  done
  # The rank count only changes which rank computes what: a scattered placement, and one that
  # leaves ranks 0 and 1 without experts, give the contiguous run's bytes.
  train_ep 3 "${args[@]}" --csv "$work/c3.csv" --save "$work/c3"
  for placement in "$(scattered_placement 8 3)" "2,2,2,2,2,2,2,2"; do
    rm -rf "$work/ep"
    train_ep 3 "${args[@]}" --csv "$work/ep.csv" --save "$work/ep" --placement "$placement"
    echo -n "$family np=3 --placement $placement: "; /usr/bin/python3 "$compare" csv "$work/c3.csv" "$work/ep.csv" exact
    /usr/bin/python3 "$compare" ckpt "$work/c3/model.safetensors" "$work/ep/model.safetensors" 0 >/dev/null
  done
done

# Stop at step 3 with a checkpoint, resume to step 6: the uninterrupted run's rows, at the same
# rank count bit for bit; resumed at another rank count, within the tolerance.
args=("${base[@]}" --family deepseek_v3)
train_ep 2 "${args[@]}" --csv "$work/straight.csv"
rm -rf "$work/ck"
train_ep 2 "${args[@]}" --csv "$work/part.csv" --save "$work/ck" --stop-at 3
train_ep 2 --resume "$work/ck" --data "$work/text.txt" --threads 1 --csv "$work/resumed.csv"
echo -n "resume at np=2: "; /usr/bin/python3 "$compare" csv "$work/straight.csv" "$work/resumed.csv" exact 4
train_ep 3 --resume "$work/ck" --data "$work/text.txt" --threads 1 --csv "$work/resumed3.csv"
echo -n "resume the np=2 checkpoint at np=3: "; /usr/bin/python3 "$compare" csv "$work/straight.csv" "$work/resumed3.csv" close 4

# Failures: one message, every rank ends.
expect_failure "too few sequences for the ranks" "cannot be shared by" train "${base[@]}" --batch-tokens 128
expect_failure "a placement of the wrong length" "lists 2 owners" train "${base[@]}" --placement 0,1
expect_failure "--compare" "cannot be given with --expert-parallel" train "${base[@]}" --compare "$work/cmp"
expect_failure "a missing checkpoint" "no config.json there" train --resume "$work/none" --data "$work/text.txt"
expect_failure "a bad flag" "--dim (0)" train "${base[@]}" --dim 0
expect_failure "a diverging run" "step 2: rank 0: .*non-finite" train "${base[@]}" --lr 1e12 --clip 0 --warmup 0 --eval-every 0
[[ ! -e "$work/cmp" ]] || { echo "FAIL: --compare wrote $work/cmp" >&2; exit 1; }
echo "ok: moekit train --expert-parallel"
