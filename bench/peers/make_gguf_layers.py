#!/usr/bin/env python3
"""Writes a GGUF file of Qwen3-MoE blocks for benchmarks: `moekit bench --decode --model FILE.gguf`
against bench/peers/ggml_decode on the same type and shape. Not a test; never in CI.

    python3 bench/peers/make_gguf_layers.py --type q4_K --layers 2 --dims 2048,768,128,8 --out /tmp/q4_K.gguf

The experts' blocks are seeded random bytes with each block's scales set to small finite values (a
benchmark's time does not depend on the codes; ggml's quantizer would take minutes at this size);
the router is f32. Needs numpy and gguf (PyPI, or llama.cpp's gguf-py on PYTHONPATH).
"""
import argparse

import numpy as np

# type -> (ggml id, block, bytes, [(offset, two little-endian bytes) of each f16 scale in a block])
HALF = bytes([0x00, 0x20])  # f16 0.0078125
TYPES = {
    "q4_0": (2, 32, 18, [(0, HALF)]),
    "q8_0": (8, 32, 34, [(0, HALF)]),
    "q2_K": (10, 256, 84, [(80, HALF), (82, HALF)]),
    "q4_K": (12, 256, 144, [(0, HALF), (2, HALF)]),
    "q5_K": (13, 256, 176, [(0, HALF), (2, HALF)]),
    "q6_K": (14, 256, 210, [(208, HALF)]),
    "mxfp4": (39, 32, 17, [(0, bytes([120]))]),
}


def blocks(rng, rows, cols, t):
    tid, block, nbytes, scales = TYPES[t]
    b = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for off, val in scales:
        b[:, off:off + len(val)] = np.frombuffer(val, dtype=np.uint8)
    return b.reshape(rows, cols // block * nbytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", required=True, choices=sorted(TYPES))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dims", default="2048,768,128,8", help="D,F,E,K (default: Qwen3-30B-A3B)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import gguf

    D, F, E, K = (int(v) for v in args.dims.split(","))
    rng = np.random.default_rng(args.seed)
    qtype = gguf.GGMLQuantizationType(TYPES[args.type][0])
    w = gguf.GGUFWriter(args.out, "qwen3moe")
    w.add_block_count(args.layers)
    w.add_context_length(4096)
    w.add_embedding_length(D)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_uint32("qwen3moe.expert_feed_forward_length", F)
    for layer in range(args.layers):
        p = f"blk.{layer}."
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((E, D)) * 0.05).astype(np.float32))
        for name, (out, inp) in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
            b = blocks(rng, E * out, inp, args.type).reshape(E, out, -1)
            w.add_tensor(p + f"ffn_{name}_exps.weight", b, raw_shape=b.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
