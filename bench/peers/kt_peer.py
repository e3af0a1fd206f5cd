#!/usr/bin/env python3
"""The kt-kernel side of bench/peers (optional, `run.sh --with-kt`); runs in build-peers/venv-kt.

kt-kernel's KTMoEWrapper needs an NVIDIA driver (pinned host buffers), so this uses its low-level
extension the way its own CPU paths do: a CPUInfer worker pool of one subpool with N threads, a
MOEConfig with the expert weights' pointers, a MoE class chosen by the CPU variant kt-kernel
loaded, load_weights_task once, then per timed call forward_task + sync.

What it times is the routed experts of a layer only: kt-kernel takes the routing (ids, weights) as
input and has no router and no shared experts (in KTransformers those run on the GPU). Each timed
call gets a fresh random routing (K distinct experts per token) and a fresh input.

Formats: bf16 weights everywhere; on AMX builds also AMXInt8_MOE / AMXInt4_MOE (they quantize the
bf16 weights themselves at load, and quantize activations to int8). The AVX2 / AVX512 int formats
need weights pre-packed in GPTQ / raw-int4 layouts and are not attempted.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

SHAPES = {
    "qwen3": dict(D=2048, F=768, E=128, K=8),
    "deepseek": dict(D=2048, F=1408, E=64, K=6),
}


def short_error(e):
    return f"{type(e).__name__}: {e}".strip().splitlines()[0][:200]


def check_first_token(call, gate, up, down):
    """Relative error of kt-kernel's output for token 0 against SwiGLU experts in torch fp32."""
    ids, w, x, out, _ = call
    x0 = x[0].float()
    ref = torch.zeros_like(x0)
    for j, e in enumerate(ids[0].tolist()):
        h = torch.nn.functional.silu(gate[e].float() @ x0) * (up[e].float() @ x0)
        ref += w[0, j] * (down[e].float() @ h)
    return float((out[0].float() - ref).norm() / ref.norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default="qwen3,deepseek")
    ap.add_argument("--tokens", default="1,32,512")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import kt_kernel
    ext = kt_kernel.kt_kernel_ext
    variant = kt_kernel.__cpu_variant__
    moe_mod = ext.moe

    pool_cfg = ext.WorkerPoolConfig()
    pool_cfg.subpool_count = 1
    pool_cfg.subpool_numa_map = [0]
    pool_cfg.subpool_thread_count = [args.threads]
    cpu_infer = ext.CPUInfer(pool_cfg)

    # (format, class name, how weights are handed over): the AMX classes take one pointer per
    # projection to [E, F, D] / [E, D, F] bf16; AVX2BF16_MOE one pointer per expert (as kt-kernel's
    # own NativeMoEWrapper does for BF16).
    if hasattr(moe_mod, "AMXBF16_MOE"):
        formats = [("bf16", "AMXBF16_MOE", "stacked"), ("int8", "AMXInt8_MOE", "stacked"),
                   ("int4", "AMXInt4_MOE", "stacked")]
    else:
        formats = [("bf16", "AVX2BF16_MOE", "per_expert")]
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, D, F = s["E"], s["K"], s["D"], s["F"]
        gen = torch.Generator().manual_seed(0)
        gate = (torch.randn(E, F, D, generator=gen) * 0.02).bfloat16().contiguous()
        up = (torch.randn(E, F, D, generator=gen) * 0.02).bfloat16().contiguous()
        down = (torch.randn(E, D, F, generator=gen) * 0.02).bfloat16().contiguous()
        for fmt, cls_name, handover in formats:
            base = dict(system="kt-kernel", shape=shape, format=fmt, threads=args.threads,
                        backend=f"{variant}: {cls_name}", reps=args.reps,
                        note="routed experts only (no router, no shared experts)")
            cls = getattr(moe_mod, cls_name, None)
            if cls is None:
                rows += [dict(base, tokens=t, error=f"{cls_name} not in this build") for t in tokens]
                continue
            try:
                mask = torch.zeros(E, dtype=torch.bool)  # no expert on a GPU
                cfg = moe_mod.MOEConfig(E, K, D, F, mask.data_ptr())
                cfg.layer_idx = 0
                cfg.pool = cpu_infer.backend_
                cfg.max_len = max(tokens)
                if handover == "stacked":
                    cfg.gate_proj, cfg.up_proj, cfg.down_proj = gate.data_ptr(), up.data_ptr(), down.data_ptr()
                else:
                    cfg.gate_projs = [[gate[e].data_ptr() for e in range(E)]]
                    cfg.up_projs = [[up[e].data_ptr() for e in range(E)]]
                    cfg.down_projs = [[down[e].data_ptr() for e in range(E)]]
                    cfg.gate_scales = cfg.up_scales = cfg.down_scales = [[0] * E]
                moe = cls(cfg)
                phys_to_log = torch.arange(E, dtype=torch.int64)
                cpu_infer.submit(moe.load_weights_task(phys_to_log.data_ptr()))
                cpu_infer.sync()
            except Exception as e:
                rows += [dict(base, tokens=t, error=short_error(e)) for t in tokens]
                continue
            for t in tokens:
                try:
                    calls = []
                    for _ in range(args.reps + 1):
                        # K distinct experts per token, uniformly: a fresh routing per call.
                        ids = torch.rand(t, E, generator=gen).topk(K, dim=-1).indices.to(torch.int64).contiguous()
                        w = torch.softmax(torch.randn(t, K, generator=gen), dim=-1).float().contiguous()
                        x = torch.randn(t, D, generator=gen).bfloat16().contiguous()
                        calls.append((ids, w, x, torch.empty(t, D, dtype=torch.bfloat16),
                                      torch.tensor([t], dtype=torch.int32)))
                    times = []
                    for i, (ids, w, x, out, qlen) in enumerate(calls):
                        t0 = time.perf_counter()
                        cpu_infer.submit(moe.forward_task(qlen.data_ptr(), K, ids.data_ptr(), w.data_ptr(),
                                                          x.data_ptr(), out.data_ptr(), False))
                        cpu_infer.sync()
                        if i > 0:  # calls[0] is the warm-up
                            times.append((time.perf_counter() - t0) * 1e3)
                    err = check_first_token(calls[-1], gate, up, down)
                    if not err < 0.05:  # also catches NaN: a wrong weight handover times garbage
                        raise RuntimeError(f"output differs from a torch reference (rel. error {err:.3g})")
                    rows.append(dict(base, tokens=t, median_ms=statistics.median(times), min_ms=min(times),
                                     rel_error_token0=err))
                except Exception as e:
                    rows.append(dict(base, tokens=t, error=short_error(e)))
            del moe
    with open(args.json_out, "w") as f:
        json.dump(dict(rows=rows, variant=variant, version=getattr(kt_kernel, "__version__", "?")), f, indent=1)


if __name__ == "__main__":
    main()
