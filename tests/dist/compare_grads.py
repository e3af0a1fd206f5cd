#!/usr/bin/python3
"""Compares the gradient file of `mpirun -np N moekit backward --expert-parallel` (GOT) with the
single-process `moekit backward` file (WANT), as docs/distributed.md's reduction contract says:
the same tensors (names, dtypes, shapes, in order); `dx` and every routed expert's tensor (a name
with an `.experts.` or `.switch_mlp.` part) the same bytes; the router, router-bias and shared-expert gradients —
sums over all tokens that each rank adds up over its own before the ranks' partials are added in
rank order — within REL (default 1e-5) of the tensor's max |WANT|.

Usage: compare_grads.py WANT.safetensors GOT.safetensors [REL]. Exits 1 naming the first
difference. Parses safetensors by hand (u64 header length, JSON header, raw little-endian data).
"""
import json
import re
import struct
import sys

import numpy as np

EXACT = re.compile(r"^dx$|\.experts\.|\.switch_mlp\.")


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"FAIL: {path}: {name} is {t['dtype']}, expected F32")
        begin, end = t["data_offsets"]
        tensors[name] = np.frombuffer(body[begin:end], np.float32).reshape(t["shape"])
    return tensors


def main():
    want_path, got_path = sys.argv[1], sys.argv[2]
    rel = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    want, got = read(want_path), read(got_path)
    if list(want) != list(got):
        sys.exit(f"FAIL: {got_path} holds {list(got)}, the single-process file {list(want)}")
    exact = summed = 0
    worst = 0.0
    for name, w in want.items():
        g = got[name]
        if g.shape != w.shape:
            sys.exit(f"FAIL: {name}: shape {g.shape}, one process {w.shape}")
        if EXACT.search(name):
            if g.tobytes() != w.tobytes():
                i = np.flatnonzero(g.ravel().view(np.uint32) != w.ravel().view(np.uint32))[0]
                sys.exit(f"FAIL: {name} differs from one process at flat index {i}: {g.ravel()[i]!r} vs "
                         f"{w.ravel()[i]!r} (expected the same bytes)")
            exact += 1
            continue
        scale = float(np.abs(w).max()) if w.size else 0.0
        err = float(np.abs(g.astype(np.float64) - w).max()) if w.size else 0.0
        if err > rel * scale:
            sys.exit(f"FAIL: {name}: max |difference| {err:.3g} > {rel:g} x max |one process| {scale:.3g}")
        worst = max(worst, err / scale if scale else 0.0)
        summed += 1
    if exact < 2 or summed < 1:
        sys.exit(f"FAIL: {got_path}: only {exact} exact and {summed} summed tensors (expected dx, experts, router)")
    print(f"{exact} tensors the same bytes, {summed} summed ones within {worst:.2g} of max |g|")


if __name__ == "__main__":
    main()
