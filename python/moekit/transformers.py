"""moekit as transformers' experts backend: ``experts_implementation="moekit"``.

    import moekit.transformers            # registers "moekit" in transformers' ExpertsInterface
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moekit")
    # or, on a loaded model: model.set_experts_implementation("moekit")

Every MoE model whose experts module transformers decorates with ``@use_experts_implementation``
(Qwen2/3-MoE, Mixtral, OLMoE, DeepSeek-V2/V3, GLM-4.5, GPT-OSS, MiniMax-M2, ...) then runs its
routed experts on moekit: transformers' own router chooses ``top_k_index`` / ``top_k_weights``, and
moekit runs the chosen experts (its sparse grouped kernels) on the module's parameters in place
(nothing copied, except a transposed layout: see below). Under autograd the call is a
``torch.autograd.Function`` over moekit's sparse backward, giving the gradients of the hidden
states, of every expert parameter and of ``top_k_weights`` (so transformers' router trains too).

What is read how:
  - ``gate_up_proj`` [E, 2F, D] (gate then up, or interleaved rows) and ``down_proj`` [E, D, F]:
    strided views of the parameters, read in place at every call, so an optimizer's in-place step
    is what the next call computes with.
  - transposed layouts (``is_transposed``: GPT-OSS [E, D, 2F] / [E, F, D]): moekit's kernels read
    [out, in] rows, so they get a transposed copy, made again whenever the parameter's storage or
    its in-place version counter (``tensor._version``) changes: never stale.
  - biases: copied to float32 at each call (E · (2F + D) numbers).
  - the activation: found by evaluating ``act_fn`` (SiLU, GELU, tanh-GELU, ReLU, ReLU²); GPT-OSS's
    clamped SwiGLU from its ``alpha`` / ``limit``.
Precision: float32 models compute in fp32 (the result equals ``grouped_mm``'s to fp32 rounding);
bfloat16 models (bf16 hidden states and weights) in moekit's bf16 compute mode (bf16 × bf16
products summed in fp32), to bf16 rounding.

What moekit does not run falls back to ``grouped_mm`` with one warning per reason (set
``moekit.transformers.strict = True`` to raise instead): tensors not on the CPU, float16 hidden
states, expert parallelism inside transformers (``_is_expert_parallel``), a post-expert norm, a
custom gate function other than GPT-OSS's, an activation that is none of the above.

Threads: moekit's pool and torch's intra-op threads share the cores. On small machines the
fastest setting measured is torch.set_num_threads(N) with moekit.set_num_threads(N) and
OMP_WAIT_POLICY=PASSIVE (docs/python.md, "transformers").
"""

from __future__ import annotations

import math
import warnings

import torch

from . import _moekit

NAME = "moekit"
#: Raise instead of falling back to grouped_mm for a case moekit does not run.
strict = False

_warned: set[str] = set()


class Unsupported(ValueError):
    """A call moekit's experts backend does not run (the message says why)."""


# ---------------------------------------------------------------------------------------------
# What a module computes: its body (activation), layout and flags, found once per module.

_PROBE = torch.linspace(-6.0, 6.0, 193, dtype=torch.float64)
_ACTIVATIONS = {
    "silu": lambda v: v * torch.sigmoid(v),
    "gelu": lambda v: 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0))),
    "gelu_tanh": lambda v: 0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3))),
    "relu": torch.relu,
    "relu2": lambda v: torch.relu(v) ** 2,
}
_GATED_BODY = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh"}
_PLAIN_BODY = {"silu": "mlp_silu", "relu": "mlp_relu", "relu2": "mlp_relu2"}


def _activation_name(act_fn) -> str | None:
    """Which known activation act_fn computes, by evaluating it (the class names vary)."""
    try:
        with torch.no_grad():
            got = act_fn(_PROBE.clone())
    except Exception:  # noqa: BLE001 - an activation that cannot take float64 is not one we know
        return None
    for name, ref in _ACTIVATIONS.items():
        want = ref(_PROBE)
        if got.shape == want.shape and torch.allclose(got, want, rtol=1e-6, atol=1e-9):
            return name
    return None


def _is_default_gate(module) -> bool:
    fn = getattr(type(module), "_apply_gate", None)
    return fn is None or getattr(fn, "__name__", "") == "_default_apply_gate"


def _is_gpt_oss_gate(module) -> bool:
    # GPT-OSS (and the models built from it): interleaved gate/up, g = min(gate, limit),
    # u = clamp(up, -limit, limit), (u + 1) · g · sigmoid(alpha · g). Recognised by its code.
    fn = getattr(type(module), "_apply_gate", None)
    code = getattr(fn, "__code__", None)
    if code is None or not hasattr(module, "alpha") or not hasattr(module, "limit"):
        return False
    names = set(code.co_names)
    return {"clamp", "sigmoid", "alpha", "limit"} <= names


class _Plan:
    """How one experts module maps onto moekit (found once, kept on the module)."""

    def __init__(self, module):
        self.reason = None
        self.has_gate = bool(getattr(module, "has_gate", True))
        self.has_bias = bool(getattr(module, "has_bias", False))
        self.transposed = bool(getattr(module, "is_transposed", False))
        self.concatenated = bool(getattr(module, "is_concatenated", True))
        self.limit, self.alpha = 7.0, 1.702
        if getattr(module, "has_post_expert_norm", False):
            self.reason = "the experts apply a post-expert norm"
            return
        if self.has_gate and _is_gpt_oss_gate(module):
            self.body = "swiglu_clamped"
            self.limit, self.alpha = float(module.limit), float(module.alpha)
            # GPT-OSS's gate reads interleaved columns whatever the flag says.
            self.concatenated = False
            return
        if self.has_gate and not _is_default_gate(module):
            self.reason = f"{type(module).__name__} has its own gate function (_apply_gate)"
            return
        act = _activation_name(module.act_fn) if hasattr(module, "act_fn") else None
        table = _GATED_BODY if self.has_gate else _PLAIN_BODY
        if act not in table:
            self.reason = f"{type(module).__name__}'s activation {getattr(module, 'act_fn', None)!r} is not one moekit runs"
            return
        self.body = table[act]
        if self.has_gate and not self.concatenated:
            # The default gate chunks gate | up; an interleaved layout with it would be a model bug.
            self.concatenated = True


def _plan(module) -> _Plan:
    plan = module.__dict__.get("_moekit_plan")
    if plan is None:
        plan = _Plan(module)
        module.__dict__["_moekit_plan"] = plan
    return plan


# ---------------------------------------------------------------------------------------------
# The parameters as moekit's [E, out, in] views.


def _rows(module, name: str, t: torch.Tensor, transposed: bool) -> torch.Tensor:
    """t as [E, out, in] rows: t itself (detached), or a transposed copy kept while t is unchanged."""
    t = t.detach()
    if not transposed:
        return t
    cache = module.__dict__.setdefault("_moekit_transposed", {})
    key = (t.data_ptr(), t._version, tuple(t.shape), t.dtype)
    hit = cache.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    copy = t.transpose(-2, -1).contiguous()
    cache[name] = (key, copy)
    return copy


def _split(t: torch.Tensor, concatenated: bool):
    """The gate and up halves of a fused [E, 2F, ...] tensor (dim 1): halves or even/odd rows."""
    if concatenated:
        f = t.shape[1] // 2
        return t[:, :f], t[:, f:]
    return t[:, 0::2], t[:, 1::2]


def _fuse(gate: torch.Tensor, up: torch.Tensor, concatenated: bool) -> torch.Tensor:
    """The inverse of _split."""
    if concatenated:
        return torch.cat([gate, up], dim=1)
    return torch.stack([gate, up], dim=2).reshape(gate.shape[0], 2 * gate.shape[1], *gate.shape[2:])


def _params(module, plan: _Plan):
    """The parameters the call reads, in the autograd Function's order: (fused or up, down, biases...)."""
    if plan.has_gate:
        names = ["gate_up_proj", "down_proj"] + (["gate_up_proj_bias", "down_proj_bias"] if plan.has_bias else [])
    else:
        names = ["up_proj", "down_proj"] + (["up_proj_bias", "down_proj_bias"] if plan.has_bias else [])
    return names, [getattr(module, n) for n in names]


def _experts(module, plan: _Plan, params, bf16: bool):
    w_in, down = params[0], params[1]
    w_rows = _rows(module, "w_in", w_in, plan.transposed)
    down_rows = _rows(module, "down", down, plan.transposed)
    gate = up = gate_bias = up_bias = down_bias = None
    if plan.has_gate:
        gate, up = _split(w_rows, plan.concatenated)
    else:
        up = w_rows
    if plan.has_bias:
        b_in, down_bias = params[2].detach(), params[3].detach()
        if plan.has_gate:
            gate_bias, up_bias = _split(b_in, plan.concatenated)
        else:
            up_bias = b_in
    return _moekit.Experts(
        plan.body, gate, up, down_rows, gate_bias, up_bias, down_bias,
        swiglu_limit=plan.limit, swiglu_alpha=plan.alpha, bf16_compute=bf16,
    )


def _param_grads(plan: _Plan, grads: dict, params, needs):
    """moekit's gradients (f32, [E, out, in]) in the parameters' own layout and dtype."""
    out = []
    if plan.has_gate and _fused_grads(plan):  # moekit wrote gate‖up as the parameter stores it
        w_in, b_in = grads["experts.gate"], grads.get("experts.gate_bias")
    elif plan.has_gate:
        w_in = _fuse(grads["experts.gate"], grads["experts.up"], plan.concatenated)
        b_in = (_fuse(grads["experts.gate_bias"], grads["experts.up_bias"], plan.concatenated)
                if plan.has_bias else None)
    else:
        w_in, b_in = grads["experts.up"], grads.get("experts.up_bias")
    mats = [w_in, grads["experts.down"]]
    if plan.transposed:
        mats = [m.transpose(-2, -1) for m in mats]
    out.extend(mats)
    if plan.has_bias:
        out.extend([b_in, grads["experts.down_bias"]])
    return [g.to(p.dtype) if need else None for g, p, need in zip(out, params, needs)]


def _fused_grads(plan: _Plan) -> bool:
    return plan.has_gate and plan.concatenated


class _ExpertsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weights, ids, experts, plan, *params):  # noqa: ARG004 - params carry the graph edges
        y, saved = experts.forward_train(hidden.detach(), ids, weights.detach())
        ctx.experts, ctx.saved, ctx.plan = experts, saved, plan
        ctx.hidden_dtype, ctx.weights_dtype = hidden.dtype, weights.dtype
        ctx.params = params
        return y.to(hidden.dtype)

    @staticmethod
    def backward(ctx, dy):
        d = dy.detach()
        if d.dtype not in (torch.float32, torch.bfloat16):
            d = d.float()
        dx, dweights, grads = ctx.experts.backward(ctx.saved, d.contiguous(), fuse_gate_up=_fused_grads(ctx.plan))
        ctx.saved = None
        needs = ctx.needs_input_grad
        param_grads = _param_grads(ctx.plan, grads, ctx.params, needs[5:])
        return (
            dx.to(ctx.hidden_dtype) if needs[0] else None,
            dweights.to(ctx.weights_dtype) if needs[1] else None,
            None, None, None,
            *param_grads,
        )


# ---------------------------------------------------------------------------------------------
# The backend.


def _fallback(module, reason: str, hidden_states, top_k_index, top_k_weights):
    if strict:
        raise Unsupported(f"moekit experts backend: {reason}")
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"moekit experts backend: {reason}; running transformers' grouped_mm instead", stacklevel=3)
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return ALL_EXPERTS_FUNCTIONS["grouped_mm"](module, hidden_states, top_k_index, top_k_weights)


def experts_forward(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' ExpertsInterface function: Σ_k top_k_weights · expert_{top_k_index}(hidden_states)."""
    plan = _plan(module)
    if plan.reason is not None:
        return _fallback(module, plan.reason, hidden_states, top_k_index, top_k_weights)
    names, params = _params(module, plan)
    tensors = [hidden_states, top_k_index, top_k_weights, *params]
    if any(t.device.type != "cpu" for t in tensors):
        return _fallback(module, "a tensor is not on the CPU (moekit computes on the CPU)",
                         hidden_states, top_k_index, top_k_weights)
    if getattr(module, "_is_expert_parallel", False):
        return _fallback(module, "expert parallelism inside transformers (moekit's own runs over MPI)",
                         hidden_states, top_k_index, top_k_weights)
    x_dtype = hidden_states.dtype
    if x_dtype not in (torch.float32, torch.bfloat16) or any(
            p.dtype not in (torch.float32, torch.bfloat16) for p in params):
        return _fallback(module, f"dtype {x_dtype} / {params[0].dtype} (moekit runs float32 and bfloat16)",
                         hidden_states, top_k_index, top_k_weights)
    shape = hidden_states.shape
    hidden = hidden_states.reshape(-1, shape[-1])
    T, K = hidden.shape[0], top_k_index.shape[-1]
    ids = top_k_index.reshape(T, K)
    weights = top_k_weights.reshape(T, -1)
    if weights.shape[1] != K:  # DeepSeek-V2 style: dense [T, E] weights
        weights = weights.gather(1, ids.long())
    ids32 = ids.to(torch.int32).contiguous()
    if T == 0:
        return torch.zeros_like(hidden_states)
    bf16 = x_dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in params[:2])
    experts = _experts(module, plan, params, bf16)
    train = torch.is_grad_enabled() and (
        hidden.requires_grad or weights.requires_grad or any(p.requires_grad for p in params))
    if train:
        y = _ExpertsFunction.apply(hidden, weights, ids32, experts, plan, *params)
    else:
        y = experts.forward(hidden, ids32, weights).to(x_dtype)
    return y.reshape(shape)


def register(name: str = NAME) -> None:
    """Registers experts_forward in transformers' ExpertsInterface under `name` (import does it for "moekit")."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(name, experts_forward)


register()
