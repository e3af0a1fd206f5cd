#!/usr/bin/env python3
"""The torch side of `moekit train`: training steps of the same small byte-level MoE language model.

A benchmark, never a test: it asserts nothing about speed or loss. It builds, in torch, exactly
the model `moekit train` trains (same structure, same matmul FLOPs), times R training steps after
W warm-up steps, and writes one JSON object (--json-out) and a one-line summary (stdout). The
performance target it serves is "moekit >= 2x torch's tokens/s for a training step, same model,
same run": run both on the same machine, one after the other, A B A B.

Run it with build-peers/venv (torch + transformers, see setup.sh):

  build-peers/venv/bin/python bench/peers/train_lm_peer.py                       # default model
  build-peers/venv/bin/python bench/peers/train_lm_peer.py --family qwen3_moe \\
      --layers 1 --dim 2048 --experts 128 --top-k 8 --expert-width 768 --shared 0 \\
      --context 4 --batch-tokens 512                                            # reference MoE shape
  train_lm_peer.py [--family deepseek_v3|qwen3_moe] [--layers L] [--dim D] [--experts E]
                   [--top-k K] [--expert-width F] [--shared S] [--context N] [--batch-tokens T]
                   [--steps R] [--warmup-steps W] [--threads N] [--moe hf|loop]
                   [--backend grouped_mm|eager] [--adamw-impl fused|foreach|for-loop]
                   [--no-moe-timing] [--data PATH] [--seed S] [--json-out FILE]

Defaults: deepseek_v3, L = 2, D = 128, E = 16, K = 4, F = 64, S = 1 (0 for qwen3_moe, which has no
shared experts), N = 8, T = 4096, R = 10 timed steps after W = 2 warm-up steps, 2 threads,
--moe hf, --backend grouped_mm, --adamw-impl fused, data /usr/share/common-licenses.

The model (V = 256 byte values; every tensor fp32):
  data     the bytes of the regular files under --data (sorted by path, symlinks followed), read
           once. A batch is T / seq_len windows (seq_len = min(T, 256); T must be a multiple of
           it) of seq_len + 1 consecutive bytes at uniformly random offsets >= N - 1, so that the
           N - 1 bytes before each window are real corpus bytes; targets are the next byte.
  context  X0[t] = concat(E[tok_t], E[tok_{t-1}], ..., E[tok_{t-N+1}]) in R^{N*D}, E = nn.Embedding
           (V, D); h0 = X0 @ P^T, P = nn.Linear(N*D, D, bias=False).
  blocks   L pre-norm residual blocks h_{l+1} = h_l + MoE_l(RMSNorm_l(h_l)), with
           RMSNorm(x) = x / sqrt(mean(x^2) + 1e-6) * g (torch.nn.RMSNorm, learned g, init 1).
  output   logits = RMSNorm_f(h_L) @ W^T, W = nn.Linear(D, V, bias=False); loss = mean
           cross-entropy against the next byte.
  MoE      --moe hf (default): transformers' own block.
             deepseek_v3: DeepseekV3MoE, DeepseekV3Config(hidden_size=D, n_routed_experts=E,
               num_experts_per_tok=K, moe_intermediate_size=F, n_shared_experts=S, n_group=1,
               topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, hidden_act="silu"):
               sigmoid scores, top-K chosen on scores + e_score_correction_bias (a zero buffer,
               not trained), weights = the chosen scores renormalised; plus S shared SwiGLU
               experts as one MLP of width S*F. (The block also runs its group selection, trivial
               with one group, and the scaling by 1.0: a few cheap ops, part of transformers' block.)
             qwen3_moe: Qwen3MoeSparseMoeBlock, Qwen3MoeConfig(hidden_size=D, num_experts=E,
               num_experts_per_tok=K, moe_intermediate_size=F, norm_topk_prob=True): softmax
               scores, top-K, renormalised; no shared experts (S must be 0).
             Experts are SwiGLU: down(silu(gate(x)) * up(x)), gate/up fused as [E, 2F, D].
           --moe loop: a plain hand-written torch MoE of the same parameters and FLOPs: router
             linear, sigmoid (+ the zero selection bias) or softmax scores, top-K, renormalised,
             then one iteration per expert that got rows (index_select, two linears, index_add_),
             for a sanity comparison with transformers' block.
  optimizer torch.optim.AdamW(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), decay on
           weight matrices and the embedding only, never on the RMSNorm gains (moekit's rule);
           torch.nn.utils.clip_grad_norm_(max_norm=1.0) before each step.
  init     every weight matrix ~ normal(0, 1/sqrt(fan_in)) (fan_in = the last dimension: D for
           the router and gate/up, F for down, N*D for P, D for W; the expert tensors included),
           the embedding ~ normal(0, 1), RMSNorm gains 1. Speed does not depend on it; the loss of
           the first and last timed steps is printed to show that it trains.

Backends (why the defaults). --backend sets config._experts_implementation of transformers'
experts module (a standalone block's config has none: transformers would warn and fall back to
its eager loop, so it is always set here). "grouped_mm" is what transformers picks by default
for a model and what torch_peer.py's train rows use; with torch > 2.10 on CPU it calls torch's own
torch.nn.functional.grouped_mm (no per-expert Python loop, one kernel forward and one backward per
projection), checked at run time (the JSON's "experts_kernel"); "eager" is the experts class's own
Python loop over the experts hit (one_hot mask, torch.where, index_add_). "batched_mm" is not
offered: it gathers one weight matrix per (token, expert) pair (T*K*2F*D floats: 51 GB at the
reference shape). --adamw-impl fused is torch's fastest AdamW on CPU (its default there is the
per-tensor for-loop, ~5x slower on ~1M parameters); same arithmetic, so the fastest is the fair peer.

What is timed. One step = forward (embedding to loss), loss.backward(), clip_grad_norm_,
optimizer.step(), optimizer.zero_grad(set_to_none=True), timed with time.perf_counter around
all of it (the batch is drawn before the timer starts; CPU ops are synchronous). Reported: median
and min of the R timed step times, tokens/s = T / median (and T / min), every step's time.

MoE share: module hooks on each MoE block (forward pre-hook and forward hook: forward time;
full backward pre-hook and full backward hook: the time from the gradient of the block's output
being ready to the gradient of its input being computed, which is the block's backward since on
CPU the autograd engine runs the nodes in the calling thread, one at a time, and nothing outside a
block becomes ready while it runs). Summed over the L blocks, divided by the step's time; the
median over the timed steps is reported. Overhead: four Python calls and two identity autograd
nodes per block per step (microseconds against steps of milliseconds); --no-moe-timing removes
the hooks to check that the step time does not move.

Threads: OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS are set to --threads before
torch is imported (MKL and OpenMP read them at load) unless the caller already set them (a
mismatch with --threads is warned about and recorded); then torch.set_num_threads(N) and one
interop thread, as torch_peer.py does.
"""
import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
import warnings


def _threads_from_argv(argv, default=2):
    """--threads N from the command line, before argparse and before torch is imported."""
    for i, a in enumerate(argv):
        try:
            if a == "--threads" and i + 1 < len(argv):
                return int(argv[i + 1])
            if a.startswith("--threads="):
                return int(a.split("=", 1)[1])
        except ValueError:
            return default  # argparse reports it properly later
    return default


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_N_THREADS = _threads_from_argv(sys.argv[1:])
THREAD_ENV_PRESET = {v: os.environ.get(v) for v in THREAD_VARS}
for _v in THREAD_VARS:
    os.environ.setdefault(_v, str(_N_THREADS))

import torch  # noqa: E402  (after the thread variables, on purpose)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

V = 256  # byte vocabulary


# --------------------------------------------------------------------------------------------
# Data
def read_corpus(path):
    """The concatenated bytes of the regular files under `path` (sorted by path), or of `path`."""
    if os.path.isfile(path):
        files = [path]
    else:
        files = []
        for root, dirs, names in os.walk(path, followlinks=True):
            dirs.sort()
            files.extend(os.path.join(root, n) for n in names
                         if os.path.isfile(os.path.join(root, n)))
        files.sort()
    chunks = []
    for f in files:
        with open(f, "rb") as fh:
            chunks.append(fh.read())
    data = b"".join(chunks)
    return data, len(files)


class Batches:
    """Random windows of the corpus: context ids [B, S, N] (tok_t, tok_{t-1}, ...) and targets [B, S]."""

    def __init__(self, data, batch_tokens, seq_len, context, seed):
        self.corpus = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.b, self.s, self.n = batch_tokens // seq_len, seq_len, context
        self.gen = torch.Generator().manual_seed(seed)
        self.span = torch.arange(seq_len + context)  # N - 1 bytes before, S + 1 in the window

    def next(self):
        # Window start (its first input byte) in [N - 1, len - S - 1]: the N - 1 bytes before it
        # and its S + 1 bytes (S inputs, the last target) are all in the corpus.
        starts = torch.randint(self.n - 1, self.corpus.numel() - self.s, (self.b,),
                               generator=self.gen)
        w = self.corpus[(starts - (self.n - 1)).unsqueeze(1) + self.span]  # [B, S + N]
        # Position i (w index p = N - 1 + i): w[p], w[p - 1], ..., w[p - N + 1]; target w[p + 1].
        ctx = w[:, : self.s + self.n - 1].unfold(1, self.n, 1).flip(-1).contiguous()  # [B, S, N]
        return ctx, w[:, self.n:].contiguous()


# --------------------------------------------------------------------------------------------
# MoE blocks
def experts_backends():
    """The experts implementations this transformers knows ('eager' is the class's own loop)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        return {"eager", *ALL_EXPERTS_FUNCTIONS.keys()}
    except ImportError:
        return {"eager"}


def experts_kernel(backend):
    """What the experts' matmuls really run on, for the JSON."""
    if backend == "eager":
        return "transformers experts eager loop (torch.nn.functional.linear per expert hit)"
    try:
        from transformers.integrations.moe import _can_use_grouped_mm
        x, w = torch.zeros(4, 8), torch.zeros(2, 8, 8)
        offs = torch.tensor([2, 4], dtype=torch.int32)
        if _can_use_grouped_mm(x, w, offs):
            name = ("torch.nn.functional.grouped_mm" if hasattr(F, "grouped_mm")
                    else "torch._grouped_mm")
            return f"{name} (CPU kernel of torch {torch.__version__})"
        return "transformers grouped_mm_fallback (one torch.mm per expert)"
    except Exception as e:  # a private helper: its absence is not an error of the benchmark
        return f"unknown ({type(e).__name__})"


def hf_block_factory(args):
    """A function making one transformers MoE block (all blocks share one config)."""
    if args.family == "deepseek_v3":
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

        config = DeepseekV3Config(hidden_size=args.dim, num_hidden_layers=args.layers,
                                  n_routed_experts=args.experts, num_experts_per_tok=args.top_k,
                                  moe_intermediate_size=args.expert_width,
                                  n_shared_experts=args.shared, n_group=1, topk_group=1,
                                  norm_topk_prob=True, routed_scaling_factor=1.0,
                                  hidden_act="silu", first_k_dense_replace=0)
        cls = DeepseekV3MoE
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        config = Qwen3MoeConfig(hidden_size=args.dim, num_hidden_layers=args.layers,
                                num_experts=args.experts, num_experts_per_tok=args.top_k,
                                moe_intermediate_size=args.expert_width, norm_topk_prob=True)
        cls = Qwen3MoeSparseMoeBlock
    # The experts module keeps this config and reads the field at every call.
    config._experts_implementation = args.backend
    return lambda: cls(config)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): the shared experts of the loop MoE (as DeepseekV3MLP)."""

    def __init__(self, d, f):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LoopMoE(nn.Module):
    """A plain torch MoE block: router, top-K, renormalised weights, a loop over the experts."""

    def __init__(self, d, e, k, f, shared, scoring):
        super().__init__()
        self.d, self.e, self.k, self.scoring = d, e, k, scoring
        self.router = nn.Linear(d, e, bias=False)
        if scoring == "sigmoid":
            self.register_buffer("selection_bias", torch.zeros(e))
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, d))
        self.down_proj = nn.Parameter(torch.empty(e, d, f))
        self.shared_experts = SwiGLU(d, shared * f) if shared > 0 else None

    def forward(self, hidden):
        shape = hidden.shape
        x = hidden.reshape(-1, self.d)
        logits = self.router(x)
        if self.scoring == "sigmoid":
            scores = logits.sigmoid()
            idx = torch.topk(scores.detach() + self.selection_bias, self.k, dim=-1).indices
            w = scores.gather(1, idx)
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            w, idx = torch.topk(logits.softmax(dim=-1), self.k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)           # (token, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.e).tolist()
        rows = order // self.k                              # the token of each pair
        pair_w = w.reshape(-1).index_select(0, order)
        out = torch.zeros_like(x)
        start = 0
        for ex, c in enumerate(counts):
            if c == 0:
                continue
            r = rows[start:start + c]
            gate, up = F.linear(x.index_select(0, r), self.gate_up_proj[ex]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[ex]) * pair_w[start:start + c, None]
            out.index_add_(0, r, y)
            start += c
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.view(shape)


# --------------------------------------------------------------------------------------------
# The language model
class ByteMoeLM(nn.Module):
    def __init__(self, args, make_moe):
        super().__init__()
        d, n = args.dim, args.context
        self.embed = nn.Embedding(V, d)
        self.proj = nn.Linear(n * d, d, bias=False)
        self.norms = nn.ModuleList(nn.RMSNorm(d, eps=1e-6) for _ in range(args.layers))
        self.moes = nn.ModuleList(make_moe() for _ in range(args.layers))
        self.norm_f = nn.RMSNorm(d, eps=1e-6)
        self.head = nn.Linear(d, V, bias=False)

    def forward(self, ctx, targets):
        h = self.proj(self.embed(ctx).flatten(2))  # [B, S, N*D] -> [B, S, D]
        for norm, moe in zip(self.norms, self.moes):
            h = h + moe(norm(h))
        logits = self.head(self.norm_f(h))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def init_weights(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() == 0:
                continue  # a zero-width shared MLP (deepseek_v3 with S = 0)
            if p.dim() == 1:
                p.fill_(1.0)  # RMSNorm gains
            elif name.startswith("embed."):
                p.normal_(0.0, 1.0, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)


def matmul_flops_per_token(args):
    """Forward matmul FLOPs per token (2 per multiply-add); a training step is ~3x."""
    d, f = args.dim, args.expert_width
    per_layer = 2 * d * args.experts + (args.top_k + args.shared) * 6 * d * f
    return 2 * args.context * d * d + args.layers * per_layer + 2 * d * V


# --------------------------------------------------------------------------------------------
class MoeTimer:
    """Forward and backward wall time inside the MoE blocks, from module hooks (see docstring)."""

    def __init__(self):
        self.fwd = self.bwd = 0.0
        self._t0 = {}

    def reset(self):
        self.fwd = self.bwd = 0.0

    def attach(self, module):
        key = id(module)

        def fwd_pre(mod, inputs):
            self._t0[("f", key)] = time.perf_counter()

        def fwd_post(mod, inputs, output):
            self.fwd += time.perf_counter() - self._t0.pop(("f", key))

        def bwd_pre(mod, grad_output):
            self._t0[("b", key)] = time.perf_counter()

        def bwd_post(mod, grad_input, grad_output):
            self.bwd += time.perf_counter() - self._t0.pop(("b", key))

        module.register_forward_pre_hook(fwd_pre)
        module.register_forward_hook(fwd_post)
        module.register_full_backward_pre_hook(bwd_pre)
        module.register_full_backward_hook(bwd_post)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--family", default="deepseek_v3", choices=["deepseek_v3", "qwen3_moe"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-width", type=int, default=64)
    ap.add_argument("--shared", type=int, default=None,
                    help="shared experts (default 1 for deepseek_v3, 0 for qwen3_moe)")
    ap.add_argument("--context", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--moe", default="hf", choices=["hf", "loop"])
    ap.add_argument("--backend", default="grouped_mm", choices=["grouped_mm", "eager"],
                    help="transformers experts implementation (--moe hf only)")
    ap.add_argument("--adamw-impl", default="fused", choices=["fused", "foreach", "for-loop"])
    ap.add_argument("--no-moe-timing", action="store_true",
                    help="no hooks on the MoE blocks (no MoE share; checks the hooks' overhead)")
    ap.add_argument("--data", default="/usr/share/common-licenses")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.shared is None:
        args.shared = 1 if args.family == "deepseek_v3" else 0
    if args.family == "qwen3_moe" and args.shared != 0:
        ap.error("qwen3_moe has no shared experts: --shared must be 0")
    for name in ("layers", "dim", "experts", "top_k", "expert_width", "context", "batch_tokens",
                 "steps", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.shared < 0 or args.warmup_steps < 0:
        ap.error("--shared and --warmup-steps must be >= 0")
    if args.top_k > args.experts:
        ap.error("--top-k must be <= --experts")
    if args.family == "deepseek_v3" and args.moe == "hf" and args.experts < 2:
        ap.error("DeepseekV3MoE's group scores take the top 2 experts: --experts must be >= 2")
    args.seq_len = min(args.batch_tokens, 256)
    if args.batch_tokens % args.seq_len:
        ap.error(f"--batch-tokens must be a multiple of seq_len = min(T, 256) = {args.seq_len}")
    return args


def main():
    args = parse_args()
    import transformers

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    for var in THREAD_VARS:
        if os.environ[var] != str(args.threads):
            print(f"train_lm_peer: warning: {var}={os.environ[var]} (set by the caller) but"
                  f" --threads {args.threads}", file=sys.stderr)

    data, n_files = read_corpus(args.data)
    if len(data) < args.seq_len + args.context:
        sys.exit(f"train_lm_peer: {args.data}: {len(data)} bytes, fewer than seq_len + N ="
                 f" {args.seq_len + args.context}")
    batches = Batches(data, args.batch_tokens, args.seq_len, args.context, args.seed)

    scoring = "sigmoid" if args.family == "deepseek_v3" else "softmax"
    if args.moe == "hf":
        if args.backend not in experts_backends():
            sys.exit(f"train_lm_peer: transformers {transformers.__version__} has no experts"
                     f" backend '{args.backend}' (has {sorted(experts_backends())})")
        make_moe = hf_block_factory(args)
        kernel = experts_kernel(args.backend)
    else:
        def make_moe():
            return LoopMoE(args.dim, args.experts, args.top_k, args.expert_width, args.shared,
                           scoring)
        kernel = "hand-written loop (index_select, torch.nn.functional.linear, index_add_)"
    with warnings.catch_warnings():  # deepseek_v3 with S = 0: a zero-width shared MLP, harmless
        warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
        model = ByteMoeLM(args, make_moe)
    init_weights(model, args.seed)
    model.train()

    timer = None
    if not args.no_moe_timing:
        timer = MoeTimer()
        for moe in model.moes:
            timer.attach(moe)

    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    impl = {"fused": dict(fused=True), "foreach": dict(foreach=True),
            "for-loop": dict(foreach=False, fused=False)}[args.adamw_impl]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.01),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=3e-3, betas=(0.9, 0.999), eps=1e-8, **impl)

    step_ms, warmup_ms, moe_fwd_ms, moe_bwd_ms, losses = [], [], [], [], []
    for i in range(args.warmup_steps + args.steps):
        ctx, targets = batches.next()
        if timer is not None:
            timer.reset()
        t0 = time.perf_counter()
        loss = model(ctx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - t0) * 1e3
        if i < args.warmup_steps:
            warmup_ms.append(ms)
            continue
        step_ms.append(ms)
        losses.append(loss.item())
        if timer is not None:
            moe_fwd_ms.append(timer.fwd * 1e3)
            moe_bwd_ms.append(timer.bwd * 1e3)

    med, best = statistics.median(step_ms), min(step_ms)
    flops_tok = matmul_flops_per_token(args)
    out = dict(
        system="torch", kind="train step (fwd + bwd + clip + AdamW + zero_grad)",
        family=args.family, moe=args.moe,
        backend=args.backend if args.moe == "hf" else None, experts_kernel=kernel,
        module=(type(model.moes[0]).__module__.replace("__main__", "train_lm_peer") + "."
                + type(model.moes[0]).__name__),
        adamw_impl=args.adamw_impl,
        config=dict(vocab=V, layers=args.layers, dim=args.dim, experts=args.experts,
                    top_k=args.top_k, expert_width=args.expert_width, shared=args.shared,
                    context=args.context, batch_tokens=args.batch_tokens, seq_len=args.seq_len,
                    windows=args.batch_tokens // args.seq_len, scoring=scoring,
                    lr=3e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, clip=1.0,
                    dtype="fp32"),
        parameters=sum(p.numel() for p in params),
        matmul_flops_per_step=3 * flops_tok * args.batch_tokens,
        corpus=dict(path=args.data, files=n_files, bytes=len(data),
                    sha256=hashlib.sha256(data).hexdigest()),
        steps=args.steps, warmup_steps=args.warmup_steps, seed=args.seed,
        threads=args.threads, torch_threads=torch.get_num_threads(),
        thread_env={v: os.environ.get(v) for v in THREAD_VARS},
        thread_env_preset={v: x for v, x in THREAD_ENV_PRESET.items() if x is not None},
        versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                      python=sys.version.split()[0]),
        median_ms=med, min_ms=best, step_ms=step_ms, warmup_ms=warmup_ms,
        tokens_per_s=args.batch_tokens / (med / 1e3),
        tokens_per_s_best=args.batch_tokens / (best / 1e3),
        matmul_gflops=3 * flops_tok * args.batch_tokens / (med * 1e6),
        loss_first=losses[0], loss_last=losses[-1],
    )
    if timer is not None:
        shares = [(f + b) / s for f, b, s in zip(moe_fwd_ms, moe_bwd_ms, step_ms)]
        out.update(moe_share=statistics.median(shares),
                   moe_fwd_ms=statistics.median(moe_fwd_ms),
                   moe_bwd_ms=statistics.median(moe_bwd_ms),
                   moe_timing="module hooks (forward pre/post, full backward pre/post)")
    else:
        out.update(moe_share=None, moe_timing="off (--no-moe-timing)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)

    what = f"{args.moe}/{args.backend}" if args.moe == "hf" else "loop"
    share = "" if timer is None else (f", MoE {100 * out['moe_share']:.0f}% of the step"
                                      f" (fwd {out['moe_fwd_ms']:.1f} + bwd"
                                      f" {out['moe_bwd_ms']:.1f} ms)")
    print(f"torch {torch.__version__} train step {args.family} {what} L={args.layers}"
          f" D={args.dim} E={args.experts} K={args.top_k} F={args.expert_width} S={args.shared}"
          f" N={args.context} T={args.batch_tokens} threads={args.threads}:"
          f" median {med:.1f} ms (min {best:.1f}), {out['tokens_per_s']:.0f} tokens/s{share},"
          f" loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
