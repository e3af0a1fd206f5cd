#!/usr/bin/env python3
"""Plot the metrics that `moekit train` writes (tools/plot_train.py).

moekit embeds this file's text and runs it as `/usr/bin/python3 - <args>` with the script on
stdin, so it is one self-contained file needing only the standard library, numpy and matplotlib
(Agg backend, no display). It can equally be run directly: `python3 tools/plot_train.py ...`.

  run      plots one training run into a directory:
             loss.png     train loss per step (raw + moving average) and eval loss (nats);
                          eval perplexity and eval bits-per-byte at the eval steps
             maxvio.png   MaxVio_batch per MoE layer (raw faint, moving average bold) and
                          MaxVio_global per layer at the eval steps; log y if > 1 decade
             load_l{l}.png  per layer heat map of relative expert load c_i / mean(c)
                          (x = step, averaged into <= 600 bins; y = expert; 1.0 = balanced)
             bias.png     per layer, every expert's selection bias vs step (with --bias)
  compare  overlays several runs: MaxVio_batch (max over layers, smoothed, log y) and eval
           perplexity vs step, one line per LABEL=train.csv.

Inputs are CSV with a header; columns are found by name, empty cells mean "missing" (eval
columns are empty on steps without an evaluation). Bad input (missing file or column, no rows,
a malformed number) prints `plot_train.py: error: ...` to stderr and exits 2; a missing
matplotlib exits 3. Output is deterministic (no timestamp/software metadata in the PNGs).
"""
import argparse
import csv
import os
import re
import sys

PROG = "plot_train.py"
FIGSIZE, DPI = (8.0, 4.5), 120
MAX_BINS = 600  # heat-map columns
np = plt = None  # numpy / matplotlib.pyplot, imported by main() (exit 3 if missing)


class InputError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


def fail(msg, status=2):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(status)


def read_table(path, required, nonempty=("step",)):
    """Read a CSV into {column: float array (NaN = empty cell)}; validate names and numbers."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)  # keep (line number, fields), dropping blank lines
            rows = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}")
    if not rows:
        raise InputError(f"{path}: empty file (no header line)")
    header = [h.strip() for h in rows[0][1]]
    for name in required:
        if name not in header:
            raise InputError(f"{path}: missing required column '{name}'")
    if len(rows) < 2:
        raise InputError(f"{path}: no data rows")
    data = []
    for lineno, row in rows[1:]:
        if len(row) != len(header):
            raise InputError(f"{path}, line {lineno}: {len(row)} fields, header has {len(header)}")
        try:
            data.append([float(c) if c.strip() else np.nan for c in row])
        except ValueError:  # find the offending cell for the message
            for name, cell in zip(header, row):
                try:
                    float(cell) if cell.strip() else 0.0
                except ValueError:
                    raise InputError(f"{path}, line {lineno}, column '{name}': "
                                     f"not a number: {cell.strip()!r}") from None
    m = np.array(data, dtype=float).reshape(len(data), len(header))
    for name in nonempty:
        bad = np.flatnonzero(np.isnan(m[:, header.index(name)]))
        if bad.size:
            raise InputError(f"{path}, line {rows[1 + bad[0]][0]}: column '{name}' is empty")
    return {h: m[:, i] for i, h in enumerate(header)}


def layer_count(table):
    ids = [int(m.group(1)) for k in table if (m := re.fullmatch(r"maxvio_batch_l(\d+)", k))]
    return max(ids) + 1 if ids else 0


def moving_average(y, w):
    """Trailing moving average over the last w points (shorter window at the start)."""
    c = np.concatenate([[0.0], np.cumsum(y)])
    i = np.arange(len(y))
    lo = np.maximum(0, i - w + 1)
    return (c[i + 1] - c[lo]) / (i + 1 - lo)


def finite(x, y):
    m = np.isfinite(y)
    return x[m], y[m]


def log_floor(values, force=False):
    """If the positive values span > 1 decade (or force), return the floor that values (zeros
    included) are clipped to for a log axis: half the smallest, but at most 4 decades below the
    largest, so one near-zero step cannot squash the plot. Otherwise None (linear axis)."""
    v = np.concatenate([np.ravel(a) for a in values]) if values else np.array([])
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and (force or v.max() > 10 * v.min()):
        return max(v.min() / 2, v.max() * 1e-4)
    return None


def apply_log(ax, values, floor):
    """Log y axis when floor is set, with a note if any plotted value lies below the floor."""
    if floor is None:
        return
    ax.set_yscale("log")
    if any(np.nanmin(v, initial=np.inf) < floor for v in values):
        ax.text(0.01, 0.01, f"values < {floor:.1e} drawn at {floor:.1e}", fontsize=7,
                transform=ax.transAxes, color="0.4")


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {path}")


def new_fig(title, nrows=1, ncols=1, size=FIGSIZE, **kw):
    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False, **kw)
    if title:
        fig.suptitle(title)
    return fig, axes.ravel()


def plot_loss(t, out, title, smooth):
    fig, (a, b) = new_fig(title, 1, 2)
    step = t["step"]
    s, y = finite(step, t["train_loss"])
    a.plot(s, y, lw=0.5, alpha=0.4, color="C0", label="train (raw)")
    if len(y):
        a.plot(s, moving_average(y, smooth), lw=1.5, color="C0", label=f"train (avg {smooth})")
    a.plot(*finite(step, t["eval_loss"]), "o-", ms=4, lw=1, color="C3", label="eval")
    a.set(title="Loss", xlabel="step", ylabel="cross-entropy (nats/token)")
    a.legend(fontsize=8)
    s, ppl = finite(step, t["eval_ppl"])
    l1 = b.plot(s, ppl, "o-", ms=4, lw=1, color="C2", label="eval perplexity")
    if log_floor([ppl]) is not None:
        b.set_yscale("log")
    b.set(title="Eval perplexity / bits per byte", xlabel="step", ylabel="perplexity")
    b2 = b.twinx()
    l2 = b2.plot(*finite(step, t["eval_bpb"]), "s--", ms=4, lw=1, color="C4",
                 label="eval bits/byte")
    b2.set_ylabel("bits per byte")
    b.set_xlim(a.get_xlim())
    if len(ppl):
        b.legend(l1 + l2, [ln.get_label() for ln in l1 + l2], fontsize=8)
    else:
        b.text(0.5, 0.5, "no eval steps", transform=b.transAxes, ha="center")
        b.set_yticks([]), b2.set_yticks([])
    for ax in (a, b):
        ax.grid(True, alpha=0.3)
    save(fig, os.path.join(out, "loss.png"))


def plot_maxvio(t, out, title, smooth):
    L = layer_count(t)
    if L:
        series = [(f"layer {l}", t[f"maxvio_batch_l{l}"], t.get(f"maxvio_global_l{l}"))
                  for l in range(L)]
    else:  # no per-layer columns: fall back to the aggregate (max over layers)
        series = [("all layers (max)", t["maxvio_batch"], t["maxvio_global"])]
    floor = log_floor([v for _, b, g in series for v in (b, g) if v is not None])
    clip = (lambda v: np.maximum(v, floor)) if floor is not None else (lambda v: v)
    fig, (ax,) = new_fig(title)
    step, plotted = t["step"], []
    for i, (name, batch, glob) in enumerate(series):
        s, y = finite(step, batch)
        plotted.append(y)
        ax.plot(s, clip(y), lw=0.5, alpha=0.25, color=f"C{i % 10}")
        if len(y):
            ax.plot(s, clip(moving_average(y, smooth)), lw=1.5, color=f"C{i % 10}",
                    label=f"{name} batch (avg {smooth})")
        if glob is not None:
            s, g = finite(step, glob)
            plotted.append(g)
            if len(g):
                ax.plot(s, clip(g), "D", ms=4, color=f"C{i % 10}", mec="k", mew=0.5,
                        label=f"{name} global (eval)")
    apply_log(ax, plotted, floor)
    ax.set(title="Load imbalance MaxVio = (max load - mean load) / mean load", xlabel="step",
           ylabel="MaxVio (dimensionless)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(series) > 4 else 1)
    save(fig, os.path.join(out, "maxvio.png"))


def per_layer(table, path):
    """{layer: (steps, matrix[expert, step])} from a step,layer,e0.. table, sorted by step."""
    experts = sorted((k for k in table if re.fullmatch(r"e\d+", k)), key=lambda k: int(k[1:]))
    if not experts:
        raise InputError(f"{path}: no expert columns (e0, e1, ...)")
    m = np.stack([table[e] for e in experts])  # [E, rows]
    result = {}
    for l in np.unique(table["layer"]):
        rows = np.flatnonzero(table["layer"] == l)
        rows = rows[np.argsort(table["step"][rows], kind="stable")]
        result[int(l)] = (table["step"][rows], m[:, rows])
    return result


def bin_columns(steps, m, max_bins=MAX_BINS):
    """Average columns of m into at most max_bins bins (NaN-aware); returns (lo, hi, m)."""
    n = m.shape[1]
    if n <= max_bins:
        return steps[0], steps[-1], m
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    ok = np.isfinite(m)
    sums = np.add.reduceat(np.where(ok, m, 0.0), edges[:-1], axis=1)
    counts = np.add.reduceat(ok.astype(float), edges[:-1], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return steps[0], steps[-1], sums / counts


def plot_load(layers, out, title):
    from matplotlib.colors import TwoSlopeNorm
    for l, (steps, m) in sorted(layers.items()):
        lo, hi, img = bin_columns(steps, m)
        vmax = max(2.0, float(np.nanmax(img)) if np.isfinite(img).any() else 2.0)
        fig, (ax,) = new_fig(title)
        im = ax.imshow(img, aspect="auto", origin="lower", interpolation="nearest",
                       cmap="RdBu_r", norm=TwoSlopeNorm(vcenter=1.0, vmin=0.0, vmax=vmax),
                       extent=(lo - 0.5, hi + 0.5, -0.5, img.shape[0] - 0.5))
        fig.colorbar(im, ax=ax).set_label("load / mean load")
        if img.shape[0] <= 32:
            ax.set_yticks(range(img.shape[0]))
            ax.tick_params(axis="y", labelsize=6 if img.shape[0] > 16 else 8)
        ax.set(title=f"Relative expert load, layer {l} (1.0 = balanced, 0 = dead)",
               xlabel="step", ylabel="expert id")
        save(fig, os.path.join(out, f"load_l{l}.png"))


def plot_bias(layers, out, title):
    height = max(FIGSIZE[1], 2.6 * len(layers))
    fig, axes = new_fig(title, len(layers), 1, size=(FIGSIZE[0], height), sharex=True)
    for ax, (l, (steps, m)) in zip(axes, sorted(layers.items())):
        for e in range(m.shape[0]):
            colour = plt.cm.viridis(e / max(1, m.shape[0] - 1))
            ax.plot(*finite(steps, m[e]), lw=0.8, color=colour, label=f"e{e}")
        ax.set(title=f"Selection bias, layer {l}", ylabel="bias (score units)")
        ax.grid(True, alpha=0.3)
        if m.shape[0] <= 16:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    axes[-1].set_xlabel("step")
    save(fig, os.path.join(out, "bias.png"))


def cmd_run(a):
    t = read_table(a.csv, ("step", "train_loss", "eval_loss", "eval_ppl", "eval_bpb",
                           "maxvio_batch", "maxvio_global"))
    # Read and validate every input before writing anything.
    load = per_layer(read_table(a.load, ("step", "layer"), ("step", "layer")), a.load)
    bias = a.bias and per_layer(read_table(a.bias, ("step", "layer"), ("step", "layer")), a.bias)
    os.makedirs(a.out, exist_ok=True)
    plot_loss(t, a.out, a.title, a.smooth)
    plot_maxvio(t, a.out, a.title, a.smooth)
    plot_load(load, a.out, a.title)
    if bias:
        plot_bias(bias, a.out, a.title)


def cmd_compare(a):
    runs = []
    for spec in a.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise InputError(f"expected LABEL=train.csv, got {spec!r}")
        runs.append((label, read_table(path, ("step", "maxvio_batch", "eval_ppl"))))
    fig, (a1, a2) = new_fig(a.title, 1, 2)
    smoothed = []
    for _, t in runs:
        s, y = finite(t["step"], t["maxvio_batch"])
        smoothed.append((s, moving_average(y, a.smooth) if len(y) else y))
    floor = log_floor([y for _, y in smoothed], force=True)
    for i, ((label, t), (s, y)) in enumerate(zip(runs, smoothed)):
        a1.plot(s, np.maximum(y, floor) if floor else y, lw=1.3, color=f"C{i % 10}", label=label)
        a2.plot(*finite(t["step"], t["eval_ppl"]), "o-", ms=3, lw=1.2, color=f"C{i % 10}",
                label=label)
    apply_log(a1, [y for _, y in smoothed], floor)
    a1.set(title=f"MaxVio_batch (max over layers, avg {a.smooth})", xlabel="step",
           ylabel="MaxVio (dimensionless)")
    a2.set(title="Eval perplexity", xlabel="step", ylabel="perplexity")
    if log_floor([t["eval_ppl"] for _, t in runs]) is not None:
        a2.set_yscale("log")
    for ax in (a1, a2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    save(fig, a.out)


def window(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Plot `moekit train` metrics (CSV) to PNG.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="plot one run: loss, MaxVio, per-layer load heat maps, bias")
    r.add_argument("--csv", required=True, help="per-step metrics (train.csv)")
    r.add_argument("--load", required=True, help="per-expert relative load (load.csv)")
    r.add_argument("--bias", help="per-expert selection bias (bias.csv), optional")
    r.add_argument("--out", required=True, help="output directory (created if needed)")
    r.add_argument("--title", default="", help="figure title prefix")
    r.add_argument("--smooth", type=window, default=20, help="moving-average window (steps)")
    c = sub.add_parser("compare", help="overlay MaxVio_batch and eval perplexity of several runs")
    c.add_argument("--out", required=True, help="output PNG file")
    c.add_argument("--title", default="", help="figure title")
    c.add_argument("--smooth", type=window, default=20, help="moving-average window (steps)")
    c.add_argument("runs", nargs="+", metavar="LABEL=train.csv", help="runs to compare")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    global np, plt
    try:
        import numpy as np
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(f"matplotlib is not installed for {sys.executable} "
             "(Debian: apt-get install python3-matplotlib)", 3)
    try:
        (cmd_run if args.cmd == "run" else cmd_compare)(args)
    except InputError as e:
        fail(str(e))
    except OSError as e:  # e.g. output directory not writable
        fail(f"{e.filename or ''}: {e.strerror or e}")


if __name__ == "__main__":
    main()
