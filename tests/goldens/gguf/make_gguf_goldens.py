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


if __name__ == "__main__":
    main()
