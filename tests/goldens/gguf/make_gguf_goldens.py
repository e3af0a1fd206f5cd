#!/usr/bin/env python3
"""Writes the GGUF goldens of tests/io/gguf_test.cpp and tests/kernels/ggml_formats_test.cpp.

Every quantized byte here was written by ggml's own C quantizer and every reference value
dequantized by ggml's own C code (ggml_quantize_chunk and the type traits' to_float of
libggml-base), called through ctypes; the GGUF files are written by llama.cpp's gguf-py. The
references are checked against gguf-py's numpy dequantizers as well (a second, independent
implementation) before anything is written.

Regenerate (from the repository root; needs network once for the llama.cpp sources):

    bash tests/goldens/gguf/make_gguf_goldens.sh

which builds libggml-base from the llama.cpp tree inside PyPI's llama-cpp-python source
distribution with -ffp-contract=off (see below) and runs this script:

    python3 tests/goldens/gguf/make_gguf_goldens.py --ggml build-peers/ggml-ref/bin/libggml-base.so \
        --gguf-py <llama.cpp>/gguf-py --out tests/goldens/gguf

-ffp-contract=off: ggml's dequantizers write `q*d + m` (q4_1, q5_1) and `d1*q - m1` (the K-quants)
as two roundings in C; a compiler allowed to contract them into one fused multiply-add (GCC's
default with -march=native) gives other bits on FMA machines. moekit decodes as the C source is
written, and the references are made the same way.

Files written:
  blocks.gguf  for each ggml type moekit computes on: `<type>.q` [2 rows × 512] quantized by ggml
               from seeded normal weights (with a zero block, a constant block and outliers),
               `<type>.q.ref` (F32) ggml's dequantization of it; `<type>.rand` the same shape of
               seeded random bytes (every bit pattern the decoder can meet, scales included) and
               `<type>.rand.ref` ggml's dequantization of those.
  <arch>.gguf  for each llama.cpp MoE architecture moekit reads: the metadata llama.cpp's
               converter writes for it and the MoE block of layer 1 (no other tensors), each
               projection in another ggml type (quantized by ggml), plus three moekit tensors:
               `moekit.x` [T, D] F32 inputs, `moekit.ids` [T, K] I32 and `moekit.y` [T, D] F32: the
               experts chosen and the block's output computed in float64 from ggml's
               dequantization of the stored weights, as llama.cpp's build_moe_ffn computes the
               block (docs/formats.md, "GGUF").
"""
import argparse
import ctypes
import os
import sys

import numpy as np

# ggml type ids (ggml.h) of the types moekit computes on, by ggml's name.
TYPES = {
    "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_K": 10, "q3_K": 11, "q4_K": 12,
    "q5_K": 13, "q6_K": 14, "iq4_nl": 20, "iq4_xs": 23, "mxfp4": 39,
}


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class Ggml:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        self.lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                 ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    def traits(self, t):
        return self.lib.ggml_get_type_traits(t).contents

    def row_bytes(self, t, n):
        tr = self.traits(t)
        assert n % tr.blck_size == 0
        return n // tr.blck_size * tr.type_size

    def quantize(self, t, w):
        """w [rows, n] f32 -> bytes [rows, row_bytes], by ggml_quantize_chunk."""
        w = np.ascontiguousarray(w, dtype=np.float32)
        rows, n = w.shape
        out = np.zeros((rows, self.row_bytes(t, n)), dtype=np.uint8)
        written = self.lib.ggml_quantize_chunk(t, w.ctypes.data, out.ctypes.data, 0, rows, n, None)
        assert written == out.size, (t, written, out.size)
        return out

    def dequantize(self, t, q, n):
        """q [rows, row_bytes] -> f32 [rows, n], by the type's to_float (dequantize_row_*)."""
        q = np.ascontiguousarray(q, dtype=np.uint8)
        out = np.zeros((q.shape[0], n), dtype=np.float32)
        fn = self.to_float_t(self.traits(t).to_float)
        for r in range(q.shape[0]):
            fn(q[r].ctypes.data, out[r].ctypes.data, n)
        return out


def same_bits(a, b):
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def block_weights(rng, rows, n):
    w = rng.standard_normal((rows, n)).astype(np.float32) * 0.02
    w[0, :32] = 0.0                    # an all-zero block
    w[0, 32:64] = 0.0137               # a constant block
    w[1, 5] = 0.9                      # outliers
    w[1, 300] = -1.3
    return w


def write_blocks(ggml, gguf, out_dir):
    rng = np.random.default_rng(20261205)
    rows, n = 2, 512
    w = block_weights(rng, rows, n)
    writer = gguf.GGUFWriter(os.path.join(out_dir, "blocks.gguf"), "moekit-goldens")
    writer.add_string("moekit.goldens", "ggml block decoders; see make_gguf_goldens.py")
    for name, t in TYPES.items():
        qtype = gguf.GGMLQuantizationType(t)
        q = ggml.quantize(t, w)
        ref = ggml.dequantize(t, q, n)
        raw = rng.integers(0, 256, size=q.shape, dtype=np.uint8)
        raw_ref = ggml.dequantize(t, raw, n)
        # gguf-py's numpy dequantizer must agree bit for bit (NaN with NaN).
        for bytes_, r in ((q, ref), (raw, raw_ref)):
            alt = gguf.quants.dequantize(bytes_, qtype).reshape(rows, n)
            if not same_bits(alt, r):
                bad = int(np.sum(alt.view(np.uint32) != r.view(np.uint32)))
                print(f"warning: gguf-py's dequantize of {name} differs from ggml's in {bad} values", file=sys.stderr)
        writer.add_tensor(f"{name}.q", q, raw_shape=q.shape, raw_dtype=qtype)
        writer.add_tensor(f"{name}.q.ref", ref)
        writer.add_tensor(f"{name}.rand", raw, raw_shape=raw.shape, raw_dtype=qtype)
        writer.add_tensor(f"{name}.rand.ref", raw_ref)
        err = float(np.max(np.abs(ref - w)))
        print(f"{name}: {q.shape[1]} bytes per row, max |ggml(w) - w| = {err:.3g}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


GATING = {"softmax": 1, "sigmoid": 2, "softmax_weight": 3}

# One row per architecture: metadata beyond the common keys, the block's shape and the type of
# each projection (gate, up, down; shared gate, up, down), and the reference's semantics.
ARCHS = [
    dict(arch="qwen3moe", E=8, K=2, F=32, kv={"expert_feed_forward_length": 32}, types=("q4_K", "q6_K", "q8_0"),
         gating="softmax", norm=True),
    dict(arch="qwen2moe", E=8, K=2, F=32, kv={"expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 64},
         types=("q5_K", "q4_0", "q4_1"), shared=("q8_0", "f16", "q5_0"), shared_width=64, shared_gated=True,
         gating="softmax", norm=False),
    dict(arch="deepseek2", E=8, K=2, F=32,
         kv={"expert_feed_forward_length": 32, "expert_shared_count": 1, "leading_dense_block_count": 1,
             "expert_weights_scale": 2.5, "expert_weights_norm": True, "expert_gating_func": GATING["sigmoid"],
             "expert_group_count": 4, "expert_group_used_count": 2},
         types=("q2_K", "q3_K", "q5_1"), shared=("bf16", "f32", "iq4_nl"), shared_width=32, bias=True,
         gating="sigmoid", norm=True, scale=2.5, groups=(4, 2)),
    dict(arch="glm4moe", E=8, K=2, F=32,
         kv={"expert_feed_forward_length": 32, "expert_shared_count": 1, "leading_dense_block_count": 1,
             "expert_weights_scale": 1.8, "expert_weights_norm": True, "expert_gating_func": GATING["sigmoid"]},
         types=("iq4_xs", "q4_K", "q8_0"), shared=("q8_0", "q8_0", "q8_0"), shared_width=32, bias=True,
         gating="sigmoid", norm=True, scale=1.8),
    dict(arch="gpt-oss", E=4, K=2, F=32, kv={"expert_feed_forward_length": 32}, types=("mxfp4", "mxfp4", "mxfp4"),
         gating="softmax_weight", norm=False, router_bias=True, expert_bias=True, oai=True),
    dict(arch="llama", E=4, K=2, F=64, kv={"feed_forward_length": 64}, types=("q8_0", "q8_0", "q4_0"),
         gating="softmax", norm=True),
    dict(arch="llama4", E=4, K=1, F=32, kv={"expert_feed_forward_length": 32, "interleave_moe_layer_step": 2},
         types=("bf16", "bf16", "f16"), shared=("q8_0", "q8_0", "q8_0"), shared_width=32, gating="sigmoid",
         norm=False, llama4=True),
    dict(arch="olmoe", E=8, K=2, F=32, kv={"feed_forward_length": 32}, types=("f32", "f16", "q5_0"),
         gating="softmax", norm=False),
    dict(arch="minimax-m2", E=8, K=2, F=32,
         kv={"feed_forward_length": 32, "expert_feed_forward_length": 32, "expert_gating_func": GATING["sigmoid"]},
         types=("q6_K", "q5_K", "q8_0"), bias=True, gating="sigmoid", norm=True),
]

FLOAT_TYPES = {"f32": 0, "f16": 1, "bf16": 30}


def store(ggml, gguf, t, w):
    """w [..., rows, n] f32 -> (the array to write, raw dtype, ggml's dequantization as float64)."""
    shape = w.shape
    flat = w.reshape(-1, shape[-1]).astype(np.float32)
    if t == "f32":
        return flat.reshape(shape), None, flat.astype(np.float64).reshape(shape)
    if t == "f16":
        h = flat.astype(np.float16)
        return h.reshape(shape), None, h.astype(np.float64).reshape(shape)
    if t == "bf16":
        bits = (flat.view(np.uint32) + 0x7FFF + ((flat.view(np.uint32) >> 16) & 1)) >> 16  # nearest even
        b = bits.astype(np.uint16)
        back = (b.astype(np.uint32) << 16).view(np.float32)
        return b.reshape(shape), gguf.GGMLQuantizationType.BF16, back.astype(np.float64).reshape(shape)
    q = ggml.quantize(TYPES[t], flat)
    deq = ggml.dequantize(TYPES[t], q, shape[-1]).astype(np.float64)
    return q.reshape(shape[:-1] + (q.shape[-1],)), gguf.GGMLQuantizationType(TYPES[t]), deq.reshape(shape)


def reference(a, x, W):
    """The block as llama.cpp's build_moe_ffn computes it, in float64. x [T, D]; W: dequantized weights."""
    T = x.shape[0]
    E, K = a["E"], a["K"]
    logits = x @ W["router"].T
    if a.get("router_bias"):
        logits = logits + W["router_bias"]
    g = a["gating"]
    if g == "softmax":
        z = np.exp(logits - logits.max(-1, keepdims=True))
        probs = z / z.sum(-1, keepdims=True)
    elif g == "sigmoid":
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        probs = logits.copy()
    sel = probs + W["selection_bias"] if a.get("bias") else probs.copy()
    if a.get("llama4"):
        sel = logits.copy()
    if a.get("groups"):
        G, Kg = a["groups"]
        per = sel.reshape(T, G, E // G)
        score = np.sort(per, axis=-1)[..., -2:].sum(-1)
        keep = np.argsort(-score, axis=-1, kind="stable")[:, :Kg]
        mask = np.full((T, G), -np.inf)
        np.put_along_axis(mask, keep, 0.0, axis=-1)
        sel = (per + mask[..., None]).reshape(T, E)
    ids = np.argsort(-sel, axis=-1, kind="stable")[:, :K]
    # The routing must not hinge on rounding: the K-th choice clears the next by a margin.
    srt = np.sort(sel, axis=-1)[:, ::-1]
    margin = float(np.min(srt[:, K - 1] - srt[:, K])) if K < E else 1.0
    w = np.take_along_axis(probs, ids, axis=-1)
    if g == "softmax_weight":
        z = np.exp(w - w.max(-1, keepdims=True))
        w = z / z.sum(-1, keepdims=True)
    if a.get("norm"):
        w = w / np.maximum(w.sum(-1, keepdims=True), 6.103515625e-5)
    if a.get("scale", 0) not in (0, 1):
        w = w * a["scale"]
    y = np.zeros_like(x)
    for t in range(T):
        for k in range(K):
            e = ids[t, k]
            xe = x[t] * w[t, k] if a.get("llama4") else x[t]
            gate = W["gate"][e] @ xe
            up = W["up"][e] @ xe
            if a.get("expert_bias"):
                gate = gate + W["gate_bias"][e]
                up = up + W["up_bias"][e]
            if a.get("oai"):
                xg = np.minimum(gate, 7.0)
                yu = np.clip(up, -7.0, 7.0)
                h = xg / (1.0 + np.exp(-1.702 * xg)) * (yu + 1.0)
            else:
                h = gate / (1.0 + np.exp(-gate)) * up
            out = W["down"][e] @ h
            if a.get("expert_bias"):
                out = out + W["down_bias"][e]
            y[t] += out if a.get("llama4") else out * w[t, k]
    if a.get("shared"):
        gate = x @ W["shared_gate"].T
        h = gate / (1.0 + np.exp(-gate)) * (x @ W["shared_up"].T)
        s = h @ W["shared_down"].T
        if a.get("shared_gated"):
            s = s / (1.0 + np.exp(-(x @ W["shared_gate_inp"])))[:, None]
        y = y + s
    return ids, y, margin


def write_arch(ggml, gguf, a, out_dir, rng):
    D, E, F, K, T, layer = 256, a["E"], a["F"], a["K"], 8, 1
    while True:
        x = rng.standard_normal((T, D))
        W, stored = {}, {}

        def put(key, name, t, w):
            arr, raw, deq = store(ggml, gguf, t, w)
            W[key] = deq
            stored[name] = (arr, raw)

        put("router", f"blk.{layer}.ffn_gate_inp.weight", "f32", rng.standard_normal((E, D)) * 0.08)
        put("gate", f"blk.{layer}.ffn_gate_exps.weight", a["types"][0], rng.standard_normal((E, F, D)) * 0.06)
        put("up", f"blk.{layer}.ffn_up_exps.weight", a["types"][1], rng.standard_normal((E, F, D)) * 0.06)
        put("down", f"blk.{layer}.ffn_down_exps.weight", a["types"][2], rng.standard_normal((E, D, F)) * 0.06)
        if a.get("router_bias"):
            put("router_bias", f"blk.{layer}.ffn_gate_inp.bias", "f32", rng.standard_normal(E) * 0.2)
        if a.get("bias"):
            put("selection_bias", f"blk.{layer}.exp_probs_b.bias", "f32", rng.standard_normal(E) * 0.05)
        if a.get("expert_bias"):
            put("gate_bias", f"blk.{layer}.ffn_gate_exps.bias", "f32", rng.standard_normal((E, F)) * 0.1)
            put("up_bias", f"blk.{layer}.ffn_up_exps.bias", "f32", rng.standard_normal((E, F)) * 0.1)
            put("down_bias", f"blk.{layer}.ffn_down_exps.bias", "f32", rng.standard_normal((E, D)) * 0.1)
        if a.get("shared"):
            S = a["shared_width"]
            put("shared_gate", f"blk.{layer}.ffn_gate_shexp.weight", a["shared"][0], rng.standard_normal((S, D)) * 0.06)
            put("shared_up", f"blk.{layer}.ffn_up_shexp.weight", a["shared"][1], rng.standard_normal((S, D)) * 0.06)
            put("shared_down", f"blk.{layer}.ffn_down_shexp.weight", a["shared"][2], rng.standard_normal((D, S)) * 0.06)
            if a.get("shared_gated"):
                put("shared_gate_inp", f"blk.{layer}.ffn_gate_inp_shexp.weight", "f32", rng.standard_normal(D) * 0.08)
        ids, y, margin = reference(a, x, W)
        if margin > 2e-3:
            break
    arch = a["arch"]
    path = os.path.join(out_dir, f"{arch}.gguf")
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(D)
    writer.add_expert_count(E)
    writer.add_expert_used_count(K)
    for key, v in a["kv"].items():
        full = f"{arch}.{key}"
        if isinstance(v, bool):
            writer.add_bool(full, v)
        elif isinstance(v, float):
            writer.add_float32(full, v)
        else:
            writer.add_uint32(full, v)
    writer.add_string("moekit.goldens", "the MoE block of layer 1 and its float64 reference; see make_gguf_goldens.py")
    for name, (arr, raw) in stored.items():
        if raw is None:
            writer.add_tensor(name, arr)
        else:
            writer.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=raw)
    writer.add_tensor("moekit.x", x.astype(np.float32))
    writer.add_tensor("moekit.ids", ids.astype(np.int32))
    writer.add_tensor("moekit.y", y.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{arch}: types {a['types']}, routing margin {margin:.3g}, max |y| {np.abs(y).max():.3g}, "
          f"{os.path.getsize(path)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ggml", required=True, help="libggml-base.so built with -ffp-contract=off")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402  (llama.cpp's own, matching the ggml it ships with)
    import gguf.quants  # noqa: E402

    ggml = Ggml(args.ggml)
    write_blocks(ggml, gguf, args.out)
    rng = np.random.default_rng(31)
    for a in ARCHS:
        write_arch(ggml, gguf, a, args.out, rng)


if __name__ == "__main__":
    main()
