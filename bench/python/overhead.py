#!/usr/bin/env python3
"""What calling moekit from Python costs on top of the computation.

    PYTHONPATH=build/python .venv/bin/python bench/python/overhead.py [--threads 2]

1. A tiny block (D = 32, E = 8, K = 2, F = 16), T = 1: the per-call time is almost all overhead
   (argument import, GIL release, result export), for numpy and for torch inputs.
2. The Qwen3-30B-A3B layer shape (D = 2048, E = 128, K = 8, F = 768, f32, random weights in the
   row layout), T = 1 and T = 32, from Python; compare with
   `build/bin/moekit bench --shape qwen3 --dtype f32 --layout rows --tokens 1,32` run beside it.
Medians of repeated calls, fresh random routing per call (a new x each time).
"""

import argparse
import statistics
import time

import numpy as np

import moekit


def median_us(fn, inputs, repeat):
    times = []
    for i in range(repeat):
        x = inputs[i % len(inputs)]
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--skip-large", action="store_true")
    args = ap.parse_args()
    if args.threads:
        moekit.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    tiny = moekit.TrainableMoe(moekit.preset_config("qwen3_moe", 32, 8, 2, 16), seed=1)
    xs = [rng.standard_normal((1, 32), dtype=np.float32) for _ in range(64)]
    print(f"moekit threads: {moekit.num_threads()}")
    print(f"tiny block, T=1, numpy: {median_us(tiny.forward, xs, 20000):8.1f} us per call")
    try:
        import torch

        ts = [torch.from_numpy(x) for x in xs]
        print(f"tiny block, T=1, torch: {median_us(tiny.forward, ts, 20000):8.1f} us per call")
    except ImportError:
        print("tiny block, torch: (torch not installed)")
    if args.skip_large:
        return
    t0 = time.perf_counter()
    big = moekit.TrainableMoe(moekit.preset_config("qwen3_moe", 2048, 128, 8, 768), seed=2)
    print(f"qwen3 layer built (f32, random) in {time.perf_counter() - t0:.1f} s")
    for T in (1, 32):
        xs = [rng.standard_normal((T, 2048), dtype=np.float32) for _ in range(16)]
        big.forward(xs[0])
        print(f"qwen3 layer, T={T:3d}, numpy: {median_us(big.forward, xs, 40) / 1000:8.2f} ms per call")


if __name__ == "__main__":
    main()
