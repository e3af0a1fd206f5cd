#!/usr/bin/python3
"""Compares the metrics CSV of `mpirun -np N moekit train --expert-parallel` (GOT) with the
single-process run's (WANT), as docs/distributed.md's training contract says.

Usage: compare_train.py csv WANT.csv GOT.csv MODE [FIRST_STEP]
  MODE exact: every column but tokens_per_s the same text (one rank, or a resumed run against
              the uninterrupted one at the same rank count);
  MODE close: the losses, eval figures and gradient norm within 2e-5 relative (sums over the
              ranks' tokens in rank order: fp32 rounding), the rest (step, tokens, load metrics,
              learning rate, the bias range) the same text — the counts are exact, so the balancer
              moves the bias the same way.
  FIRST_STEP: compare only rows from this step on (a resumed run's CSV holds those).
       compare_train.py ckpt WANT.safetensors GOT.safetensors REL
  every tensor of the checkpoints the same names and shapes, values within REL of max |WANT|
  (REL 0: the same bytes).
Exits 1 naming the first difference.
"""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CLOSE = {"train_loss", "eval_loss", "eval_ppl", "eval_bpb", "aux_loss", "z_loss", "grad_norm"}


def rows(path, first):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if int(r["step"]) >= first]


def compare_csv(want_path, got_path, mode, first):
    want, got = rows(want_path, first), rows(got_path, first)
    if len(want) != len(got) or not want:
        sys.exit(f"FAIL: {len(got)} rows, want {len(want)}")
    for w, g in zip(want, got):
        for key in w:
            if key == "tokens_per_s":
                continue
            a, b = w[key], g.get(key)
            if mode == "close" and key in CLOSE and a != "":
                if b == "" or abs(float(a) - float(b)) > 2e-5 * max(abs(float(a)), 1e-12):
                    sys.exit(f"FAIL: step {w['step']} {key}: {b}, want {a}")
            elif a != b:
                sys.exit(f"FAIL: step {w['step']} {key}: {b}, want {a}")
    print(f"ok: {len(want)} steps ({mode})")


def compare_ckpt(want_path, got_path, rel):
    import numpy as np

    from compare_grads import read  # (the F32 safetensors reader of the backward's comparison)

    want, got = read(want_path), read(got_path)
    if list(want) != list(got):
        sys.exit(f"FAIL: tensors {sorted(set(want) ^ set(got))[:5]} differ")
    for name, a in want.items():
        b = got[name]
        if a.shape != b.shape:
            sys.exit(f"FAIL: {name}: {b.shape}, want {a.shape}")
        if rel == 0:
            if a.tobytes() != b.tobytes():
                sys.exit(f"FAIL: {name}: not the same bytes")
            continue
        scale = max(float(np.abs(a).max()) if a.size else 0.0, 1e-30)
        err = float(np.abs(a.astype(np.float64) - b).max()) if a.size else 0.0
        if err > rel * scale:
            sys.exit(f"FAIL: {name}: max error {err:.3g} of max {scale:.3g}")
    print(f"ok: {len(want)} tensors ({'same bytes' if rel == 0 else f'within {rel:g}'})")


if sys.argv[1] == "csv":
    compare_csv(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 0)
else:
    compare_ckpt(sys.argv[2], sys.argv[3], float(sys.argv[4]))
