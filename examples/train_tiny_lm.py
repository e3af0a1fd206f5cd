#!/usr/bin/env python3
"""A tiny torch transformer language model whose feed-forward blocks are moekit.torch.MoE,
trained beside the same model with transformers' own MoE block (Qwen3-MoE's
Qwen3MoeSparseMoeBlock; a plain torch loop over the experts where transformers is missing).
Prints the loss and the training speed of both.

    PYTHONPATH=build/python .venv/bin/python examples/train_tiny_lm.py            # Debian torch 1.13
    PYTHONPATH=build/python build-peers/venv/bin/python examples/train_tiny_lm.py # torch 2 + transformers

Data: the bytes of /usr/share/common-licenses (on every Debian system). Same seed, data and
sizes for both models; only the feed-forward block differs.
"""

import argparse
import os
import math
import pathlib
import time

import torch

import moekit
import moekit.torch as mt


def corpus(path="/usr/share/common-licenses"):
    data = b"".join(p.read_bytes() for p in sorted(pathlib.Path(path).rglob("*")) if p.is_file())
    return torch.tensor(list(data), dtype=torch.long)


class LoopMoE(torch.nn.Module):
    """Softmax top-K routing with renormalisation and SwiGLU experts, one expert at a time."""

    def __init__(self, d, e, k, f):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(d, e, bias=False)
        self.w_gate = torch.nn.Parameter(torch.randn(e, f, d) / math.sqrt(d))
        self.w_up = torch.nn.Parameter(torch.randn(e, f, d) / math.sqrt(d))
        self.w_down = torch.nn.Parameter(torch.randn(e, d, f) / math.sqrt(f))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        p = torch.softmax(self.gate(x), -1)
        w, ids = torch.topk(p, self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(x)
        for e in range(self.w_up.shape[0]):
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            h = torch.nn.functional.silu(x[tok] @ self.w_gate[e].T) * (x[tok] @ self.w_up[e].T)
            y.index_add_(0, tok, (h @ self.w_down[e].T) * w[tok, slot, None])
        return y.reshape(shape)


def transformers_block(d, e, k, f):
    try:
        from transformers.models.qwen3_moe import configuration_qwen3_moe as qc
        from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

        cfg = qc.Qwen3MoeConfig(hidden_size=d, moe_intermediate_size=f, num_experts=e, num_experts_per_tok=k,
                                norm_topk_prob=True, num_hidden_layers=1)
        block = qm.Qwen3MoeSparseMoeBlock(cfg)
    except Exception:  # noqa: BLE001 - transformers missing, or too new/old for this torch
        return None
    with torch.no_grad():  # bare transformers 5 modules are uninitialised
        for p in block.parameters():
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x):
            out = self.block(x)
            return out[0] if isinstance(out, tuple) else out

    return Wrapped()


class Block(torch.nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.n1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.n2 = torch.nn.LayerNorm(d)
        self.ffn = ffn

    def forward(self, x, mask):
        h = self.n1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ffn(self.n2(x))


class LM(torch.nn.Module):
    def __init__(self, make_ffn, d, layers, heads, seq):
        super().__init__()
        self.emb = torch.nn.Embedding(256, d)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d))
        self.blocks = torch.nn.ModuleList([Block(d, heads, make_ffn()) for _ in range(layers)])
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, 256)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.norm(x))


def train(name, make_ffn, data, args):
    torch.manual_seed(args.seed)
    model = LM(make_ffn, args.dim, args.layers, args.heads, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    tokens = 0
    t0 = None
    for step in range(args.steps):
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s : s + args.seq + 1] for s in starts])
        if step == 1:  # the first step warms up allocators and thread pools
            t0 = time.perf_counter()
            tokens = 0
        opt.zero_grad()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        mt.update_biases(model)
        tokens += batch[:, :-1].numel()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"  {name:<12} step {step:4d}  loss {loss.item():.3f}")
    rate = tokens / (time.perf_counter() - t0)
    print(f"{name:<12} final loss {loss.item():.3f}   {rate:8.0f} tokens/s")
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-width", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch and moekit threads (0: every core)")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch's intra-op threads (0: as --threads); see docs/python.md on spinning OpenMP threads")
    args = ap.parse_args()
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(args.torch_threads or threads)  # Debian's torch defaults to 1
    moekit.set_num_threads(threads)
    data = corpus()
    d, e, k, f = args.dim, args.experts, args.top_k, args.expert_width
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; moekit {moekit.num_threads()} threads; "
          f"D={d} E={e} K={k} F={f}, {args.layers} layers, {args.batch}x{args.seq} tokens per step")
    cfg = moekit.preset_config("qwen3_moe", hidden_size=d, num_experts=e, top_k=k, expert_width=f)
    counter = iter(range(10**6))
    rates = {"moekit": train("moekit", lambda: mt.MoE(cfg, seed=next(counter)), data, args)}
    if transformers_block(d, e, k, f) is not None:
        rates["transformers"] = train("transformers", lambda: transformers_block(d, e, k, f), data, args)
    else:
        print("(transformers' Qwen3-MoE block is not importable here: comparing with a torch loop instead)")
        rates["torch loop"] = train("torch loop", lambda: LoopMoE(d, e, k, f), data, args)
    other = [n for n in rates if n != "moekit"][0]
    print(f"moekit / {other}: {rates['moekit'] / rates[other]:.2f}x tokens/s (whole model, attention included)")


if __name__ == "__main__":
    main()
