#!/usr/bin/env python3
"""GGUF models written by llama.cpp's own converter, with transformers' float64 output.

    build-peers/venv/bin/python tests/goldens/gguf/make_converted_goldens.py \\
        --llama-cpp build-peers/ggml/llama_cpp_python-0.3.36/vendor/llama.cpp [--only qwen3moe] \\
        [--quantize build-peers/ggml/build-quant/bin/llama-quantize]

llama-quantize from the same tree (about 15 minutes on 2 cores):
    cmake -S <tree> -B build-peers/ggml/build-quant -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
    cmake --build build-peers/ggml/build-quant --target llama-quantize

For each architecture: a tiny random transformers model (seeded; two layers, hidden 32) is
saved with save_pretrained, converted by llama.cpp's `convert_hf_to_gguf.py` machinery (its
model classes, run in-process) to `conv/<arch>.f32.gguf` and `conv/<arch>.q8_0.gguf`, and the
model's own MoE block of layer L (transformers' module, in float64) gives the reference output
for a random input: `conv/<arch>.ref.gguf` holds x [T, D], y [T, D] (float64 computed, stored
f32) and L. tests/layer/gguf_converted_test.cpp runs moekit on the converted files against it.

With --quantize (llama.cpp's `llama-quantize`, built from the same tree: see
make_gguf_goldens.sh), each architecture is made a second time with hidden and expert sizes of
256 (the K-quants' block: smaller rows would make llama-quantize fall back to q5_0 / q8_0),
converted to f32 and quantized by llama-quantize itself as Q4_K_M — its own choice of type per
tensor (q4_K, q6_K for some ffn_down, the router left f32). The result is cut down to layer L's
MoE tensors and all the metadata, the quantized bytes copied as llama-quantize wrote them, into
`conv/<arch>.q4_k_m.gguf`, with `conv/<arch>.q4_k_m.ref.gguf` its reference as above plus
y_dequantized: transformers' block in float64 with each weight replaced by the value in the
Q4_K_M file, dequantized by gguf-py (dequantized_block). So the exact mode is held to float
rounding, not to the quantization's error.

The one step not llama.cpp's: the tokenizer. The tiny models have none, so the converter's
set_vocab is replaced by a stub that writes a 32-entry gpt2 vocabulary (moekit reads no vocab).
Everything else (metadata keys, tensor names, expert stacking, the q8_0 quantizer) is the
converter's. Needs torch, transformers (5.x) and numpy; the llama.cpp tree from PyPI's
llama-cpp-python source distribution (see make_gguf_goldens.sh for how to fetch it).
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

SEED = 7
D = 32
T = 6


def families(big=False):
    """The tiny models, or with big the K-quant ones: hidden and every feed-forward size 256."""
    import transformers as tf

    d = 256 if big else D
    fe, fd, fs = (256, 256, 256) if big else (32, 48, 24)  # expert, dense and shared sizes
    common = dict(vocab_size=32, hidden_size=d, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  max_position_embeddings=64, tie_word_embeddings=False)
    return {
        # name: (HF architecture, config, MoE layer, gguf architecture)
        "qwen3moe": ("Qwen3MoeForCausalLM", tf.Qwen3MoeConfig(
            **common, intermediate_size=fd, moe_intermediate_size=fe, num_hidden_layers=2, num_experts=8,
            num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]), 1, "qwen3moe"),
        "qwen2moe": ("Qwen2MoeForCausalLM", tf.Qwen2MoeConfig(
            **{k: v for k, v in common.items() if k != "head_dim"}, intermediate_size=fd, moe_intermediate_size=fe,
            shared_expert_intermediate_size=fs, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]), 1, "qwen2moe"),
        "deepseek2": ("DeepseekV3ForCausalLM", tf.DeepseekV3Config(
            **{k: v for k, v in common.items() if k not in ("head_dim", "num_key_value_heads")},
            num_key_value_heads=2, intermediate_size=fd, moe_intermediate_size=fe,
            num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
            n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1, norm_topk_prob=True,
            q_lora_rank=16 if big else None, kv_lora_rank=16,  # llama-quantize needs q_lora_rank (2 layers: not "lite")
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            # what DeepSeek-V3's released config.json says (transformers' config class drops it;
            # without it the converter writes no expert_gating_func, and llama.cpp softmaxes)
            scoring_func="sigmoid", topk_method="noaux_tc"),
            1, "deepseek2"),
        "glm4moe": ("Glm4MoeForCausalLM", tf.Glm4MoeConfig(
            **common, intermediate_size=fd, moe_intermediate_size=fe, num_hidden_layers=2, n_routed_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.5,
            first_k_dense_replace=1, norm_topk_prob=True, partial_rotary_factor=0.5), 1, "glm4moe"),
        "gpt-oss": ("GptOssForCausalLM", tf.GptOssConfig(
            **common, intermediate_size=fe, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["full_attention", "full_attention"], sliding_window=16), 1, "gpt-oss"),
        "mixtral": ("MixtralForCausalLM", tf.MixtralConfig(
            **common, intermediate_size=fe, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
            1, "llama"),
        "llama4": ("Llama4ForConditionalGeneration", tf.Llama4Config(
            text_config=dict(**common, intermediate_size=fe, intermediate_size_mlp=fd, num_hidden_layers=2,
                             num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
                             no_rope_layers=[1, 1], attention_chunk_size=16),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14, projector_input_dim=16, projector_output_dim=16,
                               vision_output_dim=16, rope_theta=10000)),
            1, "llama4"),
        "olmoe": ("OlmoeForCausalLM", tf.OlmoeConfig(
            **{k: v for k, v in common.items() if k != "head_dim"}, intermediate_size=fe, num_hidden_layers=2,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False), 1, "olmoe"),
        "minimax-m2": ("MiniMaxM2ForCausalLM", tf.MiniMaxM2Config(
            **common, intermediate_size=fe, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
            use_routing_bias=True, scoring_func="sigmoid", rotary_dim=16), 1, "minimax-m2"),
    }


def randomize(model):
    """Every parameter drawn anew (the init of some experts is zero or constant), routing biases
    included, so a wrong bias, scale or order shows."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * (0.3 if p.dim() > 1 else 0.5))
        for name, b in model.named_buffers():
            if "bias" in name and b.dtype.is_floating_point:  # e_score_correction_bias
                b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float32) * 0.5)


def moe_block(model, layer):
    if hasattr(model, "language_model"):  # llama4
        return model.language_model.model.layers[layer].feed_forward
    return model.model.layers[layer].mlp


def unique_values(model):
    """Nudges repeated parameter values apart by an ulp until no two are equal, so each value the
    converter writes can be traced back to its parameter (dequantized_block)."""
    params = list(model.parameters())
    with torch.no_grad():
        while True:
            flat = np.concatenate([p.detach().numpy().ravel() for p in params])
            _, first, counts = np.unique(flat, return_index=True, return_counts=True)
            if counts.max() == 1:
                return
            taken = np.zeros(flat.size, bool)
            taken[first] = True  # the first of each value stays; the others move up an ulp
            at = 0
            for p in params:
                v = p.detach().numpy().ravel()
                move = ~taken[at:at + v.size]
                v = np.where(move, np.nextafter(v, np.float32(np.inf)), v)
                p.copy_(torch.from_numpy(v.reshape(p.shape)))
                at += v.size


def reference(model, layer, block=None):
    d = model.config.get_text_config().hidden_size
    g = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(1, T, d, generator=g, dtype=torch.float64)
    block = (block if block is not None else moe_block(model, layer)).double()
    with torch.no_grad():
        out = block(x)
    y = out[0] if isinstance(out, tuple) else out
    return x[0].numpy(), y.reshape(T, d).numpy()


def dequantized_block(gguf, model, layer, f32_path, q_path):
    """A copy of the model's MoE block with every weight replaced by its value in the quantized
    file, dequantized by gguf-py: each value of layer `layer` in the converter's f32 file is found
    in the block's parameters (the values are unique: unique_values) and the quantized file's
    tensor of that name gives the weight at that position. No per-architecture mapping: the
    converter's stacking, splitting and transposing are undone by the values themselves."""
    import copy
    from gguf import quants

    f32 = gguf.GGUFReader(str(f32_path))
    quantized = {t.name: t for t in gguf.GGUFReader(str(q_path)).tensors}
    vals, deq = [], []
    for t in f32.tensors:
        if t.name.startswith(f"blk.{layer}.") and t.name in quantized:
            q = quantized[t.name]
            vals.append(np.asarray(t.data, dtype=np.float32).ravel())
            deq.append(np.asarray(quants.dequantize(q.data, q.tensor_type), dtype=np.float32).ravel())
            assert vals[-1].size == deq[-1].size, t.name
    vals, deq = np.concatenate(vals), np.concatenate(deq)
    order = np.argsort(vals, kind="stable")
    sorted_vals = vals[order]
    assert np.all(sorted_vals[1:] != sorted_vals[:-1]), "repeated values in the converted layer"
    block = copy.deepcopy(moe_block(model, layer))
    with torch.no_grad():
        for name, p in block.named_parameters():
            v = p.detach().numpy().ravel()
            i = np.minimum(np.searchsorted(sorted_vals, v), sorted_vals.size - 1)
            assert np.all(sorted_vals[i] == v), f"{name}: values not in the converted layer"
            p.copy_(torch.from_numpy(deq[order[i]].reshape(p.shape)))
    return block


def convert(llama_cpp, hf_dir, arch, outtype, out):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import gguf
    from conversion import get_model_class

    cls = get_model_class(arch)

    def stub_vocab(self):
        n = self.hparams.get("vocab_size", 32)
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
        self.gguf_writer.add_token_merges([])

    cls.set_vocab = stub_vocab
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    model = cls(hf_dir, ftype, out, eager=True)
    model.write()


def layer_moe_only(gguf, src, dst, layer):
    """src cut down to layer `layer`'s feed-forward tensors and all of its metadata, each tensor's
    bytes copied as they are."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    keep = [t for t in reader.tensors
            if t.name.startswith(f"blk.{layer}.") and ("ffn" in t.name or "exp_probs" in t.name)]
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return {t.name: t.tensor_type.name for t in keep}


def write_reference(gguf, path, layer, gguf_arch, x, y, y_deq=None):
    w = gguf.GGUFWriter(str(path), "moekit-reference")
    w.add_uint32("moekit.layer", layer)
    w.add_string("moekit.architecture", gguf_arch)
    w.add_tensor("x", x.astype(np.float32))
    w.add_tensor("y", y.astype(np.float32))
    if y_deq is not None:
        w.add_tensor("y_dequantized", y_deq.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_model(tf, arch, config):
    torch.manual_seed(SEED)
    config.architectures = [arch]
    model = getattr(tf, arch)(config)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    randomize(model)
    model.eval()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "conv")
    ap.add_argument("--quantize", type=Path, default=None, help="llama-quantize: also the Q4_K_M files")
    args = ap.parse_args()
    import transformers as tf
    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
    import gguf

    args.out.mkdir(exist_ok=True)
    for name, (arch, config, layer, gguf_arch) in families().items():
        if args.only and name not in args.only.split(","):
            continue
        model = make_model(tf, arch, config)
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir = Path(tmp) / name
            model.save_pretrained(hf_dir)
            for outtype in ("f32", "q8_0"):
                convert(args.llama_cpp, hf_dir, arch, outtype, args.out / f"{name}.{outtype}.gguf")
        x, y = reference(model, layer)
        write_reference(gguf, args.out / f"{name}.ref.gguf", layer, gguf_arch, x, y)
        print(name, "layer", layer, "max |y|", float(np.abs(y).max()))
    if args.quantize is None:
        return
    for name, (arch, config, layer, gguf_arch) in families(big=True).items():
        if args.only and name not in args.only.split(","):
            continue
        model = make_model(tf, arch, config)
        unique_values(model)
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir = Path(tmp) / name
            model.save_pretrained(hf_dir)
            f32 = Path(tmp) / "f32.gguf"
            q = Path(tmp) / "q4_k_m.gguf"
            convert(args.llama_cpp, hf_dir, arch, "f32", f32)
            done = subprocess.run([str(args.quantize), str(f32), str(q), "Q4_K_M"], capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"llama-quantize failed on {name}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            types = layer_moe_only(gguf, q, args.out / f"{name}.q4_k_m.gguf", layer)
            block = dequantized_block(gguf, model, layer, f32, q)
        x, y = reference(model, layer)
        _, y_deq = reference(model, layer, block)
        write_reference(gguf, args.out / f"{name}.q4_k_m.ref.gguf", layer, gguf_arch, x, y, y_deq)
        err = float(np.abs(y_deq - y).max() / np.abs(y).max())
        print(name, "Q4_K_M layer", layer, types, f"quantization moves y by {err:.3g} of max |y|")


if __name__ == "__main__":
    main()
