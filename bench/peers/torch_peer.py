#!/usr/bin/env python3
"""The torch side of bench/peers: GEMM limits and transformers' MoE blocks.

Runs inside build-peers/venv, one measurement group per process (peers.py starts it with the
thread variables already set, since MKL and OpenMP read them when torch is imported):

  torch_peer.py limits --threads N --reps R --json-out FILE
      fp32 sgemm peak of torch.matmul (MKL) and of numpy.matmul (its OpenBLAS wheel), and the bf16
      matmul peak of torch (oneDNN), at 2048^3 and at 256x768x2048 (M x N x K).
  torch_peer.py moe --shape qwen3|deepseek --dtype fp32|bf16 --backends grouped_mm,eager
                    --tokens 1,32,512 --threads N --reps R --json-out FILE
      transformers' Qwen3MoeSparseMoeBlock / DeepseekV3MoE with random weights, under
      torch.inference_mode(), one fresh random input (hence a fresh routing) per timed call.
  torch_peer.py train --shape qwen3 --tokens 512 --backends grouped_mm,eager ...
      one fp32 training step (forward + backward of the block) per timed call.

Every measured row is median and min of R timed calls after one warm-up call. A row that fails
is written with "error" instead of times; the process itself only fails on a broken setup.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback

import torch

# The reference shapes of docs/performance.md, with the same config fields as `moekit bench` (cli/bench.cpp), so both
# sides route alike: Qwen3 softmax top-8 of 128 with renormalisation; DeepSeek-V3 sigmoid scores,
# selection bias, 8 groups of which the best 4 are kept, top-6 of 64, scaling 2.5, 2 shared.
SHAPES = {
    "qwen3": dict(D=2048, F=768, E=128, K=8, shared=0),
    "deepseek": dict(D=2048, F=1408, E=64, K=6, shared=2),
}


def make_block(shape):
    """A MoE block of transformers at `shape`, fp32, all parameters random (seeded)."""
    s = SHAPES[shape]
    if shape == "qwen3":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        config = Qwen3MoeConfig(hidden_size=s["D"], num_hidden_layers=1, num_experts=s["E"],
                                num_experts_per_tok=s["K"], moe_intermediate_size=s["F"],
                                norm_topk_prob=True)
        block = Qwen3MoeSparseMoeBlock(config)
    else:
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

        config = DeepseekV3Config(hidden_size=s["D"], num_hidden_layers=1, n_routed_experts=s["E"],
                                  num_experts_per_tok=s["K"], moe_intermediate_size=s["F"],
                                  n_group=8, topk_group=4, topk_method="noaux_tc",
                                  scoring_func="sigmoid", norm_topk_prob=True,
                                  routed_scaling_factor=2.5, n_shared_experts=s["shared"],
                                  first_k_dense_replace=0)
        block = DeepseekV3MoE(config)
    # The experts' weights are torch.empty and the routers' zeros: draw them all, so that a random
    # input routes randomly. 0.02 is the usual init scale; the timings do not depend on it.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    return block, config


def experts_backends():
    """The experts implementations this transformers knows ('eager' is the class's own loop)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        return {"eager", *ALL_EXPERTS_FUNCTIONS.keys()}
    except ImportError:
        return {"eager"}


def timed(fn, inputs, budget_s=None):
    """fn on inputs[0] as warm-up, then one timed call per remaining input: (median, min) ms.
    When the warm-up call alone took longer than budget_s: (None, warm-up ms), nothing timed."""
    t0 = time.perf_counter()
    fn(inputs[0])
    warmup_ms = (time.perf_counter() - t0) * 1e3
    if budget_s is not None and warmup_ms > budget_s * 1e3:
        return None, warmup_ms
    times = []
    for x in inputs[1:]:
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def short_error(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:200]


# --------------------------------------------------------------------------------------------
def which_library(dtype):
    """Which library torch.matmul of `dtype` really calls here, from MKL's and oneDNN's verbose
    logs (both write to file descriptor 1, so that is captured around one small call)."""
    a, b = torch.randn(64, 256).to(dtype), torch.randn(256, 128).to(dtype)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON), \
                    torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch.matmul(a, b)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        log = tmp.read().decode(errors="replace")
    m = re.search(r"onednn_verbose,.*?exec,cpu,(?:matmul|inner_product),([^,]+)", log)
    if m:
        return f"oneDNN {m.group(1)}"
    m = re.search(r"MKL_VERBOSE (\w+)\(", log)
    if m:
        return f"MKL {m.group(1)}"
    return "neither MKL nor oneDNN: torch's own kernel"


def run_limits(args):
    import numpy as np

    rows = []
    gemms = [(2048, 2048, 2048), (256, 768, 2048)]  # M, N, K

    def add(name, library, dtype, mnk, make):
        m, n, k = mnk
        row = dict(name=name, library=library, dtype=dtype, M=m, N=n, K=k, threads=args.threads,
                   unit="GFLOP/s")
        try:
            # A probe of 16 rows of A against the same B first: torch's bf16 matmul on a CPU
            # without AVX512-BF16/AMX runs a slow fallback (~0.1 GFLOP/s at 2048^3, minutes a
            # call). Same B, so the same cache behaviour; the time grows linearly in M from there.
            pm = min(m, 16)
            probe = make(pm, n, k)
            probe()
            t0 = time.perf_counter()
            probe()
            rate = 2.0 * pm * n * k / (time.perf_counter() - t0) / 1e9
            estimate_s = 2.0 * m * n * k / (rate * 1e9)
            if estimate_s > args.call_budget_s:
                row["error"] = (f"{rate:.2g} GFLOP/s at {pm}×{n}×{k}: one call would take"
                                f" ~{estimate_s:.0f} s (> --call-budget-s {args.call_budget_s:g})")
            else:
                fn = make(m, n, k)
                med, best = timed(lambda _: fn(), [None] * (args.reps + 1))
                row.update(median_ms=med, min_ms=best, value=2.0 * m * n * k / (med * 1e6),
                           best_value=2.0 * m * n * k / (best * 1e6))
        except Exception as e:  # a library that cannot run this is a row, not a crash
            row["error"] = short_error(e)
        rows.append(row)

    def torch_mm(dtype):
        def make(m, n, k):
            a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
            return lambda: torch.matmul(a, b)
        return make

    def numpy_mm(m, n, k):
        a, b = np.random.rand(m, k).astype(np.float32), np.random.rand(k, n).astype(np.float32)
        return lambda: np.matmul(a, b)

    torch_blas = which_library(torch.float32)
    onednn = which_library(torch.bfloat16)
    for mnk in gemms:
        add("sgemm", f"torch {torch.__version__} matmul fp32 ({torch_blas})", "f32", mnk,
            torch_mm(torch.float32))
        add("bf16 gemm", f"torch {torch.__version__} matmul bf16 ({onednn})", "bf16", mnk,
            torch_mm(torch.bfloat16))
        add("sgemm", f"numpy {np.__version__} matmul fp32 (OpenBLAS of its wheel)", "f32", mnk,
            numpy_mm)

    # Which kernels the BLAS libraries picked at run time: the trap docs/performance.md ("Limits") describes is an OpenBLAS that
    # does not know the CPU and runs its Haswell kernels.
    blas_info = []
    try:
        import threadpoolctl
        for lib in threadpoolctl.threadpool_info():
            blas_info.append({k: lib.get(k) for k in
                              ("internal_api", "version", "architecture", "num_threads", "prefix")})
    except Exception as e:
        blas_info.append({"error": short_error(e)})
    return dict(limits=rows, blas=blas_info,
                env={k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")})


# --------------------------------------------------------------------------------------------
def run_moe(args, train=False):
    import transformers

    shape = SHAPES[args.shape]
    known = experts_backends()
    dtypes = ["fp32"] if train else args.dtype.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    block, config = make_block(args.shape)
    for dtype in dtypes:
        if dtype == "bf16":
            block = block.to(torch.bfloat16)  # in place: one copy of the weights at a time
        tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        library = which_library(tdtype)
        for backend in args.backends.split(","):
            base = dict(system="torch", shape=args.shape, format=dtype, backend=backend,
                        library=library, threads=args.threads, reps=args.reps,
                        kind="train step (fwd+bwd)" if train else "forward")
            if backend not in known:
                for t in tokens:
                    rows.append(dict(base, tokens=t, error=f"transformers {transformers.__version__}"
                                     f" has no experts backend '{backend}' (has {sorted(known)})"))
                continue
            # The experts module shares this config object and reads the field at every call.
            config._experts_implementation = backend
            skip = None  # set once a smaller T of this (dtype, backend) ran past the call budget
            prev = None  # (T, median_ms) of the last measured T
            for t in tokens:
                if skip is None and prev is not None and prev[0] >= 32:
                    # From T = 32 on the time grows about linearly with T (T = 1 reads weights).
                    estimate_s = prev[1] / 1e3 * t / prev[0]
                    if estimate_s > args.call_budget_s:
                        skip = (f"one call would take ~{estimate_s:.0f} s (from T = {prev[0]}),"
                                f" > --call-budget-s {args.call_budget_s:g}")
                if skip is not None:
                    rows.append(dict(base, tokens=t, error=skip))
                    continue
                gen = torch.Generator().manual_seed(1000 + t)
                # One fresh input per call, drawn before the timing: each call routes anew.
                inputs = [torch.randn(1, t, shape["D"], generator=gen).to(tdtype)
                          for _ in range(args.reps + 1)]
                try:
                    if train:
                        block.train()
                        grad_out = torch.randn(1, t, shape["D"], generator=gen)

                        def step(x):
                            # Gradients start from none, as after optimizer.zero_grad(); the
                            # clearing (set to None) is inside the timed call and negligible.
                            block.zero_grad(set_to_none=True)
                            block(x.detach().requires_grad_(True)).backward(grad_out)
                        med, best = timed(step, inputs, args.call_budget_s)
                        block.zero_grad(set_to_none=True)
                    else:
                        block.eval()
                        with torch.inference_mode():
                            med, best = timed(block, inputs, args.call_budget_s)
                    if med is None:
                        skip = (f"one call took {best / 1e3:.0f} s at T = {t},"
                                f" > --call-budget-s {args.call_budget_s:g}")
                        rows.append(dict(base, tokens=t, error=skip, warmup_ms=best))
                        continue
                    rows.append(dict(base, tokens=t, median_ms=med, min_ms=best))
                    prev = (t, med)
                except Exception as e:
                    rows.append(dict(base, tokens=t, error=short_error(e)))
                    traceback.print_exc(file=sys.stderr)
                del inputs
    return dict(rows=rows, versions=dict(torch=torch.__version__,
                                         transformers=transformers.__version__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["limits", "moe", "train"])
    ap.add_argument("--shape", default="qwen3", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="fp32,bf16")
    ap.add_argument("--backends", default="grouped_mm,eager")
    ap.add_argument("--tokens", default="1,32,512")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--call-budget-s", type=float, default=30.0,
                    help="skip a row whose single call takes (or would take) longer than this")
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    if args.mode == "limits":
        out = run_limits(args)
    else:
        out = run_moe(args, train=args.mode == "train")
    out["torch_threads"] = torch.get_num_threads()
    with open(args.json_out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
