#!/usr/bin/env python3
"""Decode at the memory limit: moekit against ggml's fair decode, in one run, one table.

Called by bench/peers/decode.sh (which builds the harness); not a test, never in CI.

Per format pair (moekit's formats beside ggml's type of the same or the nearest bits per weight)
and per T: moekit's `bench --decode` (its fastest mode and its exact mode), ggml's decode harness
(ggml_decode: the same number of distinct layers, the whole block as llama.cpp's build_moe_ffn
builds it, a fresh routing per call) in the plain layout and in llama.cpp's repacked one
(CPU_REPACK) where this CPU has it, and, labelled as such, ggml's cached figure from
test-backend-ops (one routing reused for hundreds of runs: its experts sit in the cache).
Every figure: median ms per layer; % of the DRAM read bandwidth moekit measured in the same run.
A VM's bandwidth can move by half within minutes, so each format pair is measured in --rounds
rounds, moekit then ggml in each: a cell is the median over the rounds, and the ratio is taken per
round (both sides minutes apart at most) and given as its median and range.
"""
import statistics
import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peers import ggml_ms  # noqa: E402  (test-backend-ops' output parser)

# moekit's qwen3 shape (docs/performance.md): D, F, E, K.
SHAPE = dict(D=2048, F=768, E=128, K=8)
# (group label, moekit fastest dtype, moekit exact dtype or None, ggml types)
PAIRS = [
    ("4-bit", "q4-int8", "q4", ["q4_0", "q4_K"]),
    ("MXFP4", "mxfp4-int8", "mxfp4", ["mxfp4"]),
    ("8-bit", "q8-int8", "q8", ["q8_0"]),
    ("bf16", "bf16", None, ["bf16"]),
    ("f32", "f32", None, ["f32"]),
]


def log(msg):
    print(f"decode: {msg}", file=sys.stderr, flush=True)


def run(cmd, env=None, timeout=3600):
    log(" ".join(cmd))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=timeout)
    with open(ARGS.log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}  (rc {p.returncode})\n{p.stderr}")
    return p


def moekit_rows(dtypes):
    cmd = [ARGS.moekit_bin, "bench", "--decode", "--shape", "qwen3", "--dtype", ",".join(dtypes), "--layout",
           "rows", "--tokens", ARGS.tokens, "--threads", str(ARGS.threads), "--reps", str(ARGS.reps), "-o", "json"]
    p = run(cmd)
    if p.returncode != 0:
        sys.exit(f"decode: moekit bench failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def ggml_layers(typ, llc):
    """As moekit's bench --decode picks L: the experts of L layers at least 8x the LLC, at most 64."""
    bits = {"q4_0": 4.5, "q4_K": 4.5, "mxfp4": 4.25, "q8_0": 8.5, "bf16": 16, "f32": 32}[typ]
    per_layer = 3 * SHAPE["D"] * SHAPE["F"] * SHAPE["E"] * bits / 8
    return max(1, min(64, math.ceil(8 * llc / per_layer)))


def ggml_rows(typ, layout, llc):
    if not ARGS.ggml_decode:
        return [], "ggml_decode not built"
    env = dict(os.environ, OMP_NUM_THREADS=str(ARGS.threads))
    cmd = [ARGS.ggml_decode, "--type", typ, "--layout", layout, "--dims",
           f"{SHAPE['D']},{SHAPE['F']},{SHAPE['E']},{SHAPE['K']}", "--tokens", ARGS.tokens, "--threads",
           str(ARGS.threads), "--layers", str(ggml_layers(typ, llc)), "--reps", str(ARGS.reps)]
    p = run(cmd, env)
    if p.returncode != 0:
        return [], (p.stderr.strip().splitlines() or ["failed"])[-1].replace("ggml_decode: ", "")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")], None


def cached_ms(typ, t):
    """test-backend-ops' MUL_MAT_ID x 3 (one routing reused: cached), or None."""
    if not ARGS.test_backend_ops:
        return None
    s = SHAPE
    env = dict(os.environ, MOEKIT_PEERS_THREADS=str(ARGS.threads),
               MOEKIT_PEERS_MMID=f"{typ}:{s['E']}:{s['K']}:{s['F']}:{t}:{s['D']}")
    params = f"type_a={typ},type_b=f32,n_mats={s['E']},n_used={s['K']},b=0,m={s['F']},n={t},k={s['D']}"
    p = run([ARGS.test_backend_ops, "perf", "-o", "MUL_MAT_ID", "-b", "CPU", "-p", params], env)
    try:
        got = ggml_ms(p.stdout) if p.returncode == 0 else None
    except RuntimeError:
        got = None
    return None if got is None else 3 * got[0]


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moekit-bin", required=True)
    ap.add_argument("--ggml-decode", default="")
    ap.add_argument("--test-backend-ops", default="")
    ap.add_argument("--formats", default=",".join(p[0] for p in PAIRS))
    ap.add_argument("--tokens", default="1,2,4,8,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="moekit, then ggml, this many times per format pair")
    ap.add_argument("--out", required=True)
    ARGS = ap.parse_args()
    ARGS.log = os.path.join(ARGS.out, "log.txt")
    want = ARGS.formats.split(",")
    pairs = [p for p in PAIRS if p[0] in want]
    if not pairs:
        sys.exit(f"decode: --formats must name some of {[p[0] for p in PAIRS]}")
    tokens = [int(t) for t in ARGS.tokens.split(",")]

    if ARGS.rounds < 1:
        sys.exit("decode: --rounds must be at least 1")

    def measure(fast, exact, gtypes, llc):
        """One round of a format pair: moekit's rows, its DRAM figure, then ggml's rows."""
        mk = moekit_rows([d for d in (fast, exact) if d])
        mrow = {(r["dtype"], r["tokens"]): r for r in mk["results"]}
        ggml = {}
        for typ in gtypes:
            for layout in ("plain", "repack"):
                rows, err = ggml_rows(typ, layout, llc if llc else mk["last_level_cache_bytes"])
                if err and not any(f["type"] == typ and f["layout"] == layout for f in results["failures"]):
                    results["failures"].append(dict(type=typ, layout=layout, reason=err))
                    log(f"ggml {typ} {layout}: {err}")
                for r in rows:
                    ggml[(typ, layout, r["tokens"])] = r
                    results["ggml"].append(r)
        results["moekit"] += mk["results"]
        results["dram_gbps"].append(mk["dram_read"]["gbps"])
        return mk, mrow, ggml

    results = dict(threads=ARGS.threads, reps=ARGS.reps, rounds=ARGS.rounds, dram_gbps=[], moekit=[], ggml=[],
                   cached=[], failures=[])
    sections, first = [], None
    for label, fast, exact, gtypes in pairs:
        rounds = []
        for _ in range(ARGS.rounds):
            mk, mrow, ggml = measure(fast, exact, gtypes, first["last_level_cache_bytes"] if first else 0)
            first = first or mk
            rounds.append((mk["dram_read"]["gbps"], mrow, ggml))
        cached = {}
        for typ in gtypes:
            for t in tokens:
                ms = cached_ms(typ, t)
                if ms is not None:
                    cached[(typ, t)] = ms
                    results["cached"].append(dict(type=typ, tokens=t, ms_x3=ms))
        sections.append((label, fast, exact, gtypes, rounds, cached))
    results.update(cpu=first["cpu"], simd=first["simd_target"], llc_bytes=first["last_level_cache_bytes"])
    drams = results["dram_gbps"]
    llc = results["llc_bytes"]

    def cell(rs):
        """Median ms over the rounds (and % of each round's DRAM figure, median) of rows rs = [(dram, row)]."""
        rs = [(d, r) for d, r in rs if r]
        if not rs:
            return "—"
        ms = statistics.median(r["ms_per_layer"] for _, r in rs)
        pct = statistics.median(100 * r["gbps"] / d for d, r in rs if d > 0)
        return f"{ms:.3g} ({pct:.0f} %)"

    lines = [f"# Decode at the memory limit: moekit vs ggml (qwen3 shape, {ARGS.threads} threads)", "",
             f"- CPU: {first['cpu']} ({first['simd_target']}); DRAM read {min(drams):.1f}–{max(drams):.1f} GB/s "
             f"(moekit, measured at each of the {len(drams)} moekit runs); LLC {llc / 2**20:.0f} MiB",
             f"- median ms per layer of {ARGS.reps} passes over L distinct layers, a fresh routing per call, median "
             f"over {ARGS.rounds} rounds (moekit, then ggml, per format pair); % = touched bytes / time / that "
             "round's DRAM read",
             "- ggml: bench/peers/ggml_decode (llama.cpp's build_moe_ffn graph, persistent thread pool), "
             "plain and CPU_REPACK layouts; 'cached' = test-backend-ops MUL_MAT_ID ×3, one routing reused "
             "(experts cached), not a fair figure",
             "- ratio: best fair ggml ÷ moekit's fast mode within each round; median (min–max over the rounds)", ""]
    for label, fast, exact, gtypes, rounds, cached in sections:
        head = ["T", f"moekit {fast}"] + ([f"moekit {exact}"] if exact else [])
        for typ in gtypes:
            head += [f"ggml {typ}", f"ggml {typ} repack", f"{typ} cached"]
        head += ["moekit ÷ best fair ggml"]
        lines += [f"## {label}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t in tokens:
            cells = [str(t)]
            for d in (fast, exact) if exact else (fast,):
                cells.append(cell([(dr, m.get((d, t))) for dr, m, _ in rounds]))
            for typ in gtypes:
                for layout in ("plain", "repack"):
                    cells.append(cell([(dr, g.get((typ, layout, t))) for dr, _, g in rounds]))
                c = cached.get((typ, t))
                cells.append(f"{c:.3g}" if c else "—")
            ratios = []
            for _, m, g in rounds:
                f_row = m.get((fast, t))
                fair = [g[k]["ms_per_layer"] for k in g if k[2] == t]
                if f_row and fair:
                    ratios.append(min(fair) / f_row["ms_per_layer"])
            cells.append(f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for f in results["failures"]:
        lines.append(f"- ggml {f['type']} {f['layout']}: not measured: {f['reason']}")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(ARGS.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(ARGS.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
