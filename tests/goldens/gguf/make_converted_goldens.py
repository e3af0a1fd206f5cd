#!/usr/bin/env python3
"""GGUF models written by llama.cpp's own converter, with transformers' float64 output.

    build-peers/venv/bin/python tests/goldens/gguf/make_converted_goldens.py \\
        --llama-cpp build-peers/ggml/llama_cpp_python-0.3.36/vendor/llama.cpp [--only qwen3moe]

For each architecture: a tiny random transformers model (seeded; two layers, hidden 32) is
saved with save_pretrained, converted by llama.cpp's `convert_hf_to_gguf.py` machinery (its
model classes, run in-process) to `conv/<arch>.f32.gguf` and `conv/<arch>.q8_0.gguf`, and the
model's own MoE block of layer L (transformers' module, in float64) gives the reference output
for a random input: `conv/<arch>.ref.gguf` holds x [T, D], y [T, D] (float64 computed, stored
f32) and L. tests/layer/gguf_converted_test.cpp runs moekit on the converted files against it.

The one step not llama.cpp's: the tokenizer. The tiny models have none, so the converter's
set_vocab is replaced by a stub that writes a 32-entry gpt2 vocabulary (moekit reads no vocab).
Everything else (metadata keys, tensor names, expert stacking, the q8_0 quantizer) is the
converter's. Needs torch, transformers (5.x) and numpy; the llama.cpp tree from PyPI's
llama-cpp-python source distribution (see make_gguf_goldens.sh for how to fetch it).
"""
import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

SEED = 7
D = 32
T = 6


def families():
    import transformers as tf

    common = dict(vocab_size=32, hidden_size=D, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  max_position_embeddings=64, tie_word_embeddings=False)
    return {
        # name: (HF architecture, config, MoE layer, gguf architecture)
        "qwen3moe": ("Qwen3MoeForCausalLM", tf.Qwen3MoeConfig(
            **common, intermediate_size=48, moe_intermediate_size=32, num_hidden_layers=2, num_experts=8,
            num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]), 1, "qwen3moe"),
        "qwen2moe": ("Qwen2MoeForCausalLM", tf.Qwen2MoeConfig(
            **{k: v for k, v in common.items() if k != "head_dim"}, intermediate_size=48, moe_intermediate_size=32,
            shared_expert_intermediate_size=24, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]), 1, "qwen2moe"),
        "deepseek2": ("DeepseekV3ForCausalLM", tf.DeepseekV3Config(
            **{k: v for k, v in common.items() if k not in ("head_dim", "num_key_value_heads")},
            num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=32,
            num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
            n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1, norm_topk_prob=True,
            q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            # what DeepSeek-V3's released config.json says (transformers' config class drops it;
            # without it the converter writes no expert_gating_func, and llama.cpp softmaxes)
            scoring_func="sigmoid", topk_method="noaux_tc"),
            1, "deepseek2"),
        "glm4moe": ("Glm4MoeForCausalLM", tf.Glm4MoeConfig(
            **common, intermediate_size=48, moe_intermediate_size=32, num_hidden_layers=2, n_routed_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.5,
            first_k_dense_replace=1, norm_topk_prob=True, partial_rotary_factor=0.5), 1, "glm4moe"),
        "gpt-oss": ("GptOssForCausalLM", tf.GptOssConfig(
            **common, intermediate_size=32, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["full_attention", "full_attention"], sliding_window=16), 1, "gpt-oss"),
        "mixtral": ("MixtralForCausalLM", tf.MixtralConfig(
            **common, intermediate_size=32, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
            1, "llama"),
        "llama4": ("Llama4ForConditionalGeneration", tf.Llama4Config(
            text_config=dict(**common, intermediate_size=32, intermediate_size_mlp=48, num_hidden_layers=2,
                             num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
                             no_rope_layers=[1, 1], attention_chunk_size=16),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14, projector_input_dim=16, projector_output_dim=16,
                               vision_output_dim=16, rope_theta=10000)),
            1, "llama4"),
        "olmoe": ("OlmoeForCausalLM", tf.OlmoeConfig(
            **{k: v for k, v in common.items() if k != "head_dim"}, intermediate_size=32, num_hidden_layers=2,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=False), 1, "olmoe"),
        "minimax-m2": ("MiniMaxM2ForCausalLM", tf.MiniMaxM2Config(
            **common, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
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


def reference(model, layer):
    g = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(1, T, D, generator=g, dtype=torch.float64)
    block = moe_block(model, layer).double()
    with torch.no_grad():
        out = block(x)
    y = out[0] if isinstance(out, tuple) else out
    return x[0].numpy(), y.reshape(T, D).numpy()


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "conv")
    args = ap.parse_args()
    import transformers as tf
    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
    import gguf

    args.out.mkdir(exist_ok=True)
    for name, (arch, config, layer, gguf_arch) in families().items():
        if args.only and name not in args.only.split(","):
            continue
        torch.manual_seed(SEED)
        config.architectures = [arch]
        model = getattr(tf, arch)(config)
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        randomize(model)
        model.eval()
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir = Path(tmp) / name
            model.save_pretrained(hf_dir)
            for outtype in ("f32", "q8_0"):
                convert(args.llama_cpp, hf_dir, arch, outtype, args.out / f"{name}.{outtype}.gguf")
        x, y = reference(model, layer)
        w = gguf.GGUFWriter(str(args.out / f"{name}.ref.gguf"), "moekit-reference")
        w.add_uint32("moekit.layer", layer)
        w.add_string("moekit.architecture", gguf_arch)
        w.add_tensor("x", x.astype(np.float32))
        w.add_tensor("y", y.astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(name, "layer", layer, "max |y|", float(np.abs(y).max()))


if __name__ == "__main__":
    main()
