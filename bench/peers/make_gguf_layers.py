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

# type -> [(offset, bytes) of each scale in a block]: f16 scales set to 0.0078125 (two
# little-endian bytes), MXFP4's e8m0 exponent to 2^-7. The type's id, block and bytes are gguf-py's
# (GGMLQuantizationType, GGML_QUANT_SIZES), not repeated here.
HALF = bytes([0x00, 0x20])
SCALES = {
    "q4_0": [(0, HALF)],
    "q8_0": [(0, HALF)],
    "q2_K": [(80, HALF), (82, HALF)],
    "q4_K": [(0, HALF), (2, HALF)],
    "q5_K": [(0, HALF), (2, HALF)],
    "q6_K": [(208, HALF)],
    "mxfp4": [(0, bytes([120]))],
}


def ggml_type(name):
    import gguf

    return gguf.GGMLQuantizationType[name.upper()]


def blocks(rng, rows, cols, t):
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[ggml_type(t)]
    b = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for off, val in SCALES[t]:
        b[:, off:off + len(val)] = np.frombuffer(val, dtype=np.uint8)
    return b.reshape(rows, cols // block * nbytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", required=True, choices=sorted(SCALES))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dims", default="2048,768,128,8", help="D,F,E,K (default: Qwen3-30B-A3B)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import gguf

    D, F, E, K = (int(v) for v in args.dims.split(","))
    rng = np.random.default_rng(args.seed)
    qtype = ggml_type(args.type)
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
