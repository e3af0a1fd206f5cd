#!/usr/bin/env python3
"""Runs moekit and its peers side by side and writes one report (bench/peers/run.sh calls this).

Each measurement runs as its own child process with the thread variables set, so that one peer
failing (an import error, a crash, running out of memory) becomes a "not measured: <reason>" row
and the rest still runs. Only the standard library is needed here; matplotlib (for the chart) is
optional. Outputs in --out: results.json (every row, limit and failure), table.md (what is
printed), chart.png.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = {  # the same shapes as torch_peer.py and `moekit bench`
    "qwen3": dict(D=2048, F=768, E=128, K=8, shared=0, label="Qwen3-30B-A3B (D 2048, F 768, E 128, K 8)"),
    "deepseek": dict(D=2048, F=1408, E=64, K=6, shared=2,
                     label="DeepSeek-style (D 2048, F 1408, E 64, K 6, 2 shared, groups 8/4)"),
}
GGML_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_K"]


def log(msg):
    print(f"peers: {msg}", file=sys.stderr, flush=True)


def short(text, n=160):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def thread_env(threads):
    """The environment of every child: each library's thread count pinned to `threads`."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["MOEKIT_PEERS_THREADS"] = str(threads)  # read by the patched test-backend-ops
    return env


def run_child(cmd, env, timeout_s, what):
    """Runs cmd; returns (stdout, None) or (None, reason). stderr goes to the log file."""
    log(f"{what}: {' '.join(cmd)}")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout_s)
    except FileNotFoundError:
        return None, f"{cmd[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s} s"
    with open(ARGS.log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}  ({time.time() - t0:.1f} s, rc {p.returncode})\n")
        f.write(p.stderr)
    if p.returncode != 0:
        tail = [l for l in p.stderr.strip().splitlines() if l.strip()][-1:] or ["(no stderr)"]
        sig = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
        return None, short(f"{sig}: {tail[0]}")
    return p.stdout, None


# ---------------------------------------------------------------------------------------------
# Machine facts
def cpu_facts():
    model = "unknown"
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        model = m.group(1).strip() if m else model
    except OSError:
        pass
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    summary = {name: name in flags for name in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni")}
    summary["amx"] = any(f.startswith("amx") for f in flags)
    return dict(model=model, flags=summary, nproc=os.cpu_count())


# ---------------------------------------------------------------------------------------------
# The pieces. Each returns (rows, limits, failures, extra); a row is one (system, T) cell.
def measure_moekit(shapes, tokens, threads, reps, env):
    # Both weight layouts: panels (repacked at load, the default) and rows (read in place, as
    # from a mapped checkpoint).
    cmd = [ARGS.moekit_bin, "bench", "--shape", ",".join(shapes), "--dtype", "f32,bf16,bf16-act,q4,q8,q4-int8,q8-int8", "--layout", "panels,rows",
           "--tokens", ",".join(map(str, tokens)), "--threads", str(threads), "--reps", str(reps),
           "-o", "json"]
    out, err = run_child(cmd, env, ARGS.piece_timeout_s, "moekit")
    if err:
        return [], [], [dict(system="moekit", reason=err)], {}
    data = json.loads(out)
    rows = [dict(system="moekit", shape=r["shape"], format=r["dtype"], backend=r.get("layout", ""), tokens=r["tokens"],
                 median_ms=r["median_ms"], min_ms=r["min_ms"], weight_gbs=r.get("weight_gbs"),
                 gflops=r.get("gflops")) for r in data["results"]]
    limits = []
    for l in data.get("limits", []):
        if l["name"] == "dram_read":
            limits.append(dict(limit="DRAM read", how=f"moekit bench: streaming sum over "
                               f"{l['bytes'] / 2**30:.0f} GiB", size="", value=l["value"],
                               unit=l["unit"]))
        else:
            size = f"{l.get('M')}×{l.get('N')}×{l.get('K')}" if "M" in l else ""
            limits.append(dict(limit=l.get("label", l["name"]), how="moekit bench (its own kernel)",
                               size=size, value=l["value"], unit=l["unit"]))
    extra = dict(commit=data.get("commit"), simd_target=data.get("simd_target"),
                 moekit_cpu=data.get("cpu"))
    return rows, limits, [], extra


def torch_child(mode, extra_args, threads, reps, env, what):
    if not ARGS.venv_python:
        return None, ARGS.venv_status or "no venv"
    path = os.path.join(ARGS.out, f"torch-{what}.json")
    cmd = [ARGS.venv_python, os.path.join(HERE, "torch_peer.py"), mode, "--threads", str(threads),
           "--reps", str(reps), "--call-budget-s", str(ARGS.call_budget_s), "--json-out", path,
           *extra_args]
    out, err = run_child(cmd, env, ARGS.piece_timeout_s, f"torch {what}")
    if err:
        return None, err
    with open(path) as f:
        return json.load(f), None


def measure_torch_limits(threads, reps, env):
    env = dict(env)
    # docs/performance.md ("Limits"): OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, where set, slow a current
    # numpy; for this measurement alone both go (threadpoolctl then says which kernel runs).
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    data, err = torch_child("limits", [], threads, reps, env, "limits")
    if err:
        return [], [dict(system="torch/numpy GEMM limits", reason=err)], {}
    arch = {b.get("internal_api"): b.get("architecture") for b in data.get("blas", [])}
    limits = []
    for l in data["limits"]:
        how = l["library"]
        if "OpenBLAS" in how and arch.get("openblas"):
            how += f", kernels: {arch['openblas']}"
        row = dict(limit=f"{l['dtype']} GEMM peak", how=how, size=f"{l['M']}×{l['N']}×{l['K']}",
                   unit=l["unit"])
        if "error" in l:
            row["error"] = l["error"]
        else:
            row.update(value=l["value"], best=l["best_value"])
        limits.append(row)
    return limits, [], dict(blas=data.get("blas"))


def measure_torch_moe(shapes, tokens, threads, reps, env):
    rows, failures, versions = [], [], {}
    for shape in shapes:
        for dtype in ("fp32", "bf16"):
            data, err = torch_child("moe", ["--shape", shape, "--dtype", dtype, "--backends",
                                            ARGS.torch_backends, "--tokens", ",".join(map(str, tokens))],
                                    threads, reps, env, f"moe-{shape}-{dtype}")
            if err:
                for backend in ARGS.torch_backends.split(","):
                    rows += [dict(system="torch", shape=shape, format=dtype, backend=backend,
                                  tokens=t, error=err) for t in tokens]
                continue
            rows += data["rows"]
            versions = data.get("versions", versions)
    # One training step at the Qwen3 shape, at T = 512 (or the largest T asked for).
    t_train = 512 if 512 in tokens else max(tokens)
    if "qwen3" in shapes:
        data, err = torch_child("train", ["--shape", "qwen3", "--backends", "grouped_mm",
                                          "--tokens", str(t_train)], threads, reps, env, "train-qwen3")
        if err:
            rows.append(dict(system="torch", shape="qwen3", format="fp32", backend="grouped_mm",
                             kind="train step (fwd+bwd)", tokens=t_train, error=err))
        else:
            rows += data["rows"]
    return rows, failures, versions


def ggml_ms(output):
    """us/run of the MUL_MAT_ID line of test-backend-ops' console output, or None."""
    for line in output.splitlines():
        m = re.search(r"MUL_MAT_ID\((.*?)\):.*?([0-9.]+) runs\s*-\s*([0-9.]+) us/run", line)
        if m:
            return float(m.group(3)) / 1e3, int(m.group(2))
        if "MUL_MAT_ID(" in line and "not supported" in line:
            raise RuntimeError("not supported by the CPU backend")
    return None


def measure_ggml(shapes, tokens, threads, env):
    if not ARGS.ggml_bin:
        return [], [dict(system="ggml", reason=ARGS.ggml_status or "no test-backend-ops")]
    rows = []
    for shape in shapes:
        s = SHAPES[shape]
        for typ in ARGS.ggml_types.split(","):
            for t in tokens:
                base = dict(system="ggml", shape=shape, format=typ, backend="mul_mat_id ×3", tokens=t)
                # One projection, gate's/up's shape: m = F rows of k = D; a layer is three of them
                # (down's is m = D, k = F: same FLOPs and bytes).
                params = (f"type_a={typ},type_b=f32,n_mats={s['E']},n_used={s['K']},b=0,"
                          f"m={s['F']},n={t},k={s['D']}")
                e = dict(env)
                e["MOEKIT_PEERS_MMID"] = f"{typ}:{s['E']}:{s['K']}:{s['F']}:{t}:{s['D']}"
                out, err = run_child([ARGS.ggml_bin, "perf", "-o", "MUL_MAT_ID", "-b", "CPU", "-p", params],
                                     e, ARGS.piece_timeout_s, f"ggml {shape} {typ} T={t}")
                try:
                    got = None if err else ggml_ms(out)
                except RuntimeError as ex:
                    err = str(ex)
                    got = None
                if got is None:
                    rows.append(dict(base, error=err or "no MUL_MAT_ID line in test-backend-ops output"))
                    continue
                ms, total_runs = got
                # test-backend-ops puts the op n times into one graph (n = 8 GFLOP / the op's
                # FLOPs + 1) and redraws the expert ids only between graphs: n runs per routing.
                flops = 2 * s["F"] * s["D"] * t * s["K"]
                rows.append(dict(base, median_ms=3 * ms, mean_not_median=True, projection_ms=ms,
                                 total_runs=total_runs,
                                 runs_per_routing=min(8190, int(8e9 // flops)) + 1))
    return rows, []


def measure_kt(shapes, tokens, threads, reps, env):
    if not ARGS.kt_python:
        return [], [dict(system="kt-kernel", reason=ARGS.kt_status or "no kt venv")]
    path = os.path.join(ARGS.out, "kt.json")
    cmd = [ARGS.kt_python, os.path.join(HERE, "kt_peer.py"), "--shapes", ",".join(shapes),
           "--tokens", ",".join(map(str, tokens)), "--threads", str(threads), "--reps", str(reps),
           "--json-out", path]
    e = dict(env)
    if ARGS.kt_variant:
        e["KT_KERNEL_CPU_VARIANT"] = ARGS.kt_variant
    out, err = run_child(cmd, e, ARGS.piece_timeout_s, "kt-kernel")
    if err:
        return [], [dict(system="kt-kernel", reason=err)]
    with open(path) as f:
        return json.load(f)["rows"], []


# ---------------------------------------------------------------------------------------------
# The report
def row_name(r):
    if r["system"] == "moekit":
        lay = r.get("backend") or "panels"
        if r["format"] == "f32":
            return "moekit f32" if lay == "panels" else f"moekit f32, {lay} (in place)"
        if r["format"] == "bf16-act":  # the bf16 compute mode: bf16 weights and activations
            where = "AMX tiles (packed)" if lay == "amx_tiles" else f"{lay} (in place)"
            return f"moekit bf16 compute mode (bf16 activations), {where}"
        if lay == "affine":
            if r["format"].endswith("-int8"):
                return f"moekit {r['format'][:-5]} (MLX affine, group 64), int8 activations (fast mode)"
            return f"moekit {r['format']} (MLX affine, group 64), exact, f32 activations"
        return f"moekit {r['format']} weights, f32 activations" + ("" if lay == "panels" else f", {lay} (in place)")
    if r["system"] == "torch":
        kind = "training step (fwd+bwd)" if r.get("kind", "").startswith("train") else "forward"
        lib = r.get("library") or ("MKL" if r["format"] == "fp32" else "oneDNN")
        lib = "torch's own kernel" if lib.startswith("neither") else lib.split()[0]
        return f"torch {r['format']} {kind}, {r['backend']} ({lib})"
    if r["system"] == "ggml":
        return f"ggml mul_mat_id ×3, {r['format']}"
    return f"{r['system']} {r['format']} {r.get('backend', '')}".strip()


def fmt_ms(v):
    return "—" if v is None else (f"{v:.3g}" if v < 100 else f"{v:.0f}")


def build_table(rows, failures, shapes, tokens):
    head = ["shape", "system / format"] + [f"T = {t}" for t in tokens] + \
           ["speed vs moekit f32 (" + " / ".join(f"T={t}" for t in tokens) + ")", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        ref = {r["tokens"]: r["median_ms"] for r in rows if r["system"] == "moekit"
               and r["shape"] == shape and r["format"] == "f32" and r.get("median_ms")
               and (r.get("backend") or "panels") == "panels"}
        order = []
        for r in rows:
            if r["shape"] == shape and row_name(r) not in order:
                order.append(row_name(r))
        for name in order:
            cells = {r["tokens"]: r for r in rows if r["shape"] == shape and row_name(r) == name}
            vals, ratios, notes = [], [], []
            for t in tokens:
                r = cells.get(t)
                ms = r.get("median_ms") if r else None
                vals.append(fmt_ms(ms))
                ratios.append(f"{ref[t] / ms:.2f}" if ms and ref.get(t) else "—")
            errs = {}
            for t in tokens:
                if cells.get(t) and cells[t].get("error"):
                    errs.setdefault(cells[t]["error"], []).append(t)
            for err, ts in errs.items():
                where = "" if len(ts) == len(tokens) else "T = " + ",".join(map(str, ts)) + " "
                notes.append(f"{where}not measured: {err}")
            any_r = next(iter(cells.values()))
            if any_r["system"] == "ggml" and any(c.get("runs_per_routing") for c in cells.values()):
                per_t = " / ".join(str(cells[t].get("runs_per_routing", "—")) if t in cells else "—"
                                   for t in tokens)
                notes.append(f"mean; each routing reused for {per_t} runs")
            if any_r.get("note"):
                notes.append(any_r["note"])
            lines.append("| " + " | ".join([shape, name] + vals + [" / ".join(ratios), "; ".join(notes)]) + " |")
    for f in failures:
        lines.append("| " + " | ".join(["all", f["system"]] + ["—"] * len(tokens) +
                                       ["—", "not measured: " + short(f["reason"])]) + " |")
    return lines


def limits_table(limits):
    lines = ["| limit | library / how | size (M×N×K) | median | best |", "|---|---|---|---|---|"]
    for l in limits:
        if l.get("error"):
            val, best = "not measured: " + short(l["error"]), ""
        else:
            val = f"{l['value']:.1f} {l['unit']}"
            best = f"{l['best']:.1f}" if l.get("best") else ""
        lines.append(f"| {l['limit']} | {l['how']} | {l.get('size', '')} | {val} | {best} |")
    return lines


def chart(rows, shapes, tokens, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no chart: {e}"
    colors = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, len(shapes), figsize=(8 * len(shapes), 6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        names = []
        for r in rows:
            if r["shape"] == shape and row_name(r) not in names:
                names.append(row_name(r))
        for name in names:
            pts = sorted((r["tokens"], r["median_ms"]) for r in rows
                         if r["shape"] == shape and row_name(r) == name and r.get("median_ms"))
            if not pts:
                continue
            system = next(r["system"] for r in rows if r["shape"] == shape and row_name(r) == name)
            style = {"moekit": "-", "torch": "--", "ggml": ":"}.get(system, "-.")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name,
                    color=colors(len(ax.lines) % 20),
                    linewidth=2.5 if system == "moekit" else 1.4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(tokens)
        ax.set_xticklabels([str(t) for t in tokens])
        ax.set_xlabel("tokens T")
        ax.set_ylabel("ms per layer (median)")
        ax.set_title(SHAPES[shape]["label"], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="qwen3,deepseek")
    ap.add_argument("--tokens", default="1,32,512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--moekit-bin", required=True)
    ap.add_argument("--venv-python", default="")
    ap.add_argument("--venv-status", default="")
    ap.add_argument("--torch-backends", default="grouped_mm,eager")
    ap.add_argument("--ggml-bin", default="")
    ap.add_argument("--ggml-status", default="")
    ap.add_argument("--ggml-version", default="")
    ap.add_argument("--ggml-types", default=",".join(GGML_TYPES))
    ap.add_argument("--with-kt", action="store_true")
    ap.add_argument("--kt-python", default="")
    ap.add_argument("--kt-status", default="")
    ap.add_argument("--kt-variant", default="")
    ap.add_argument("--call-budget-s", type=float, default=30.0)
    ap.add_argument("--piece-timeout-s", type=int, default=7200)
    ARGS = ap.parse_args()
    os.makedirs(ARGS.out, exist_ok=True)
    ARGS.log = os.path.join(ARGS.out, "log.txt")
    shapes = [s for s in ARGS.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"peers: unknown shape '{s}' (expected {', '.join(SHAPES)})")
    tokens = [int(t) for t in ARGS.tokens.split(",") if t]
    threads, reps = ARGS.threads, ARGS.reps
    env = thread_env(threads)
    cpu = cpu_facts()
    started = datetime.datetime.now().astimezone()
    t0 = time.time()

    rows, limits, failures, meta = [], [], [], {}
    r, l, f, extra = measure_moekit(shapes, tokens, threads, reps, env)
    rows += r; limits += l; failures += f; meta.update(extra)
    l, f, extra = measure_torch_limits(threads, reps, env)
    limits += l; failures += f; meta.update(extra)
    r, f, versions = measure_torch_moe(shapes, tokens, threads, reps, env)
    rows += r; failures += f; meta["torch_versions"] = versions
    r, f = measure_ggml(shapes, tokens, threads, env)
    rows += r; failures += f
    if ARGS.with_kt:
        r, f = measure_kt(shapes, tokens, threads, reps, env)
        rows += r; failures += f
    elapsed = time.time() - t0

    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
    tv = meta.get("torch_versions") or {}
    header = [
        f"# moekit vs peers, {started:%Y-%m-%d %H:%M %Z}",
        "",
        f"- CPU: {cpu['model']} ({cpu['nproc']} logical CPUs); flags: {flags}",
        f"- threads: {threads} (OMP/MKL/OPENBLAS_NUM_THREADS, torch.set_num_threads, ggml n_threads); "
        f"{reps} timed calls per row after one warm-up{' (--quick)' if ARGS.quick else ''}; "
        f"run took {elapsed / 60:.1f} min",
        f"- moekit commit {meta.get('commit', '?')} ({ARGS.moekit_bin}, SIMD target "
        f"{meta.get('simd_target', '?')}); torch {tv.get('torch', '—')}, transformers "
        f"{tv.get('transformers', '—')}; ggml from llama-cpp-python {ARGS.ggml_version or '—'}",
        "",
        "## Limits (same run)",
        "",
    ]
    table = ["", "## ms per layer (median; fresh random routing per call unless noted)", ""]
    table += build_table(rows, failures, shapes, tokens)
    table += ["", "speed vs moekit f32 = moekit f32 ms ÷ this row's ms at the same shape and T "
              "(> 1: faster than moekit f32). ggml: test-backend-ops' mean time of one projection "
              "(gate's shape) ×3; it draws a new routing per graph, but a graph repeats the op with "
              "the same routing the number of times shown, so its small-T figures run from cache."]
    text = "\n".join(header + limits_table(limits) + table) + "\n"

    chart_err = chart(rows, shapes, tokens, os.path.join(ARGS.out, "chart.png"))
    if chart_err:
        text += f"\n({chart_err})\n"
    with open(os.path.join(ARGS.out, "table.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(ARGS.out, "results.json"), "w") as fh:
        json.dump(dict(date=started.isoformat(), cpu=cpu, threads=threads, reps=reps, quick=ARGS.quick,
                       shapes=shapes, tokens=tokens, meta=meta, limits=limits, rows=rows,
                       failures=failures, elapsed_s=elapsed,
                       ggml_version=ARGS.ggml_version), fh, indent=1)
    print(text)
    log(f"wrote {ARGS.out}/results.json, table.md{'' if chart_err else ', chart.png'}, log.txt")


if __name__ == "__main__":
    main()
