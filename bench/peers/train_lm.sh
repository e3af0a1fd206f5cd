#!/usr/bin/env bash
# `moekit train` against the same language model written in torch (train_lm_peer.py), in one
# run on this machine, A B A B: tokens/s of a training step (forward, backward, clip, AdamW) and
# the share of the step spent in the MoE blocks. Not a test; never in CI.
#
#   bench/peers/train_lm.sh [--threads 2] [--rounds 2] [--configs default,reference] [--out DIR]
#
# default:   the default `moekit train` model (DeepSeek-V3 blocks, L=2 D=128 E=16 K=4 F=64, one
#            shared expert, context 8, 4096 tokens per step)
# reference: the reference MoE shape of docs/performance.md as one block (Qwen3-30B-A3B's layer: D=2048 E=128 K=8
#            F=768, no shared expert; context 4, 512 tokens per step; ~10 GB of parameters,
#            gradients and Adam state per side)
# moekit's figure is the median over steps 3.. of its per-step tokens/s (CSV); torch's the
# median over 10 timed steps after 2 warm-up steps. Env: MOEKIT_BIN, PEERS_DIR.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$ROOT/build-peers}"
moekit="${MOEKIT_BIN:-$ROOT/build/bin/moekit}"
threads=2 rounds=2 configs=default,reference out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --threads) threads="$2"; shift ;;
        --rounds) rounds="$2"; shift ;;
        --configs) configs="$2"; shift ;;
        --out) out="$2"; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "train_lm.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
    shift
done
out="${out:-$PEERS_DIR/results/train-lm-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
"$HERE/setup.sh" >&2
py="$PEERS_DIR/venv/bin/python"
[[ -x "$moekit" ]] || { echo "train_lm.sh: no moekit at $moekit" >&2; exit 1; }

declare -A model
model[default]="--family deepseek_v3 --layers 2 --dim 128 --experts 16 --top-k 4 --expert-width 64 --shared 1 --context 8 --batch-tokens 4096"
model[reference]="--family qwen3_moe --layers 1 --dim 2048 --experts 128 --top-k 8 --expert-width 768 --shared 0 --context 4 --batch-tokens 512"

export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
for cfg in ${configs//,/ }; do
    [[ -n "${model[$cfg]:-}" ]] || { echo "train_lm.sh: unknown config '$cfg'" >&2; exit 2; }
    for r in $(seq 1 "$rounds"); do
        # shellcheck disable=SC2086
        "$moekit" train ${model[$cfg]} --seq-len 256 --steps 12 --warmup 0 --eval-every 0 --eval-tokens 256 \
            --threads "$threads" --csv "$out/moekit-$cfg-$r.csv" > "$out/moekit-$cfg-$r.txt"
        # shellcheck disable=SC2086
        "$py" "$HERE/train_lm_peer.py" ${model[$cfg]} --steps 10 --warmup-steps 2 --threads "$threads" \
            --json-out "$out/torch-$cfg-$r.json" > "$out/torch-$cfg-$r.txt"
    done
done

"$py" - "$out" "$rounds" "$configs" <<'EOF'
import csv, json, re, statistics, sys
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
rows = ["| config | round | moekit tokens/s | moekit MoE share | torch tokens/s | torch MoE share | moekit / torch |",
        "|---|---|---|---|---|---|---|"]
for cfg in configs:
    for r in range(1, rounds + 1):
        with open(f"{out}/moekit-{cfg}-{r}.csv") as f:
            tps = [float(row["tokens_per_s"]) for row in csv.DictReader(f)][2:]
        m_tps = statistics.median(tps)
        share = re.search(r"\((\d+)% in the MoE blocks\)", open(f"{out}/moekit-{cfg}-{r}.txt").read())
        t = json.load(open(f"{out}/torch-{cfg}-{r}.json"))
        t_tps = t["tokens_per_s"]
        rows.append(f"| {cfg} | {r} | {m_tps:.0f} | {share.group(1) if share else '?'} % | {t_tps:.0f} | "
                    f"{100 * t['moe_share']:.0f} % | {m_tps / t_tps:.2f}x |")
text = "\n".join(rows)
open(f"{out}/train_lm.md", "w").write(text + "\n")
print(text)
EOF
echo "wrote $out/train_lm.md"
