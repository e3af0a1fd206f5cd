"""``moekit.torch.MoE``: a ``torch.nn.Module`` whose forward and backward are moekit's.

    import torch, moekit, moekit.torch as mt
    cfg = moekit.preset_config("qwen3_moe", hidden_size=256, num_experts=16, top_k=4,
                               expert_width=128, selection_bias=True)
    moe = mt.MoE(cfg, balance="loss_free_sign", bias_rate=1e-3)
    opt = torch.optim.AdamW(moe.parameters(), lr=1e-3)
    y = moe(x)                 # x [..., D] float32 or bfloat16
    loss(y).backward(); opt.step(); moe.update_bias()   # the loss-free bias step

The parameters are torch tensors that share memory with the moekit block: a torch optimizer's
in-place update is what moekit computes with next (no copies either way). Moving or converting
them (``.to(...)``, ``.double()``) breaks that sharing; the next forward raises then.
Auxiliary losses (``aux_coef``, ``seq_aux_coef``, ``z_coef``) enter the backward as extra
router-logit gradients (as Megatron's aux-loss scaler does); their value of the last training
forward is in ``moe.aux_loss``. Routing counts for the balancer are taken only in ``train()``
mode, from forwards that build a graph.
"""

from __future__ import annotations

import torch

from . import _moekit

_BALANCE = {
    None: None,
    "none": None,
    "loss_free_sign": _moekit.BalanceRule.sign,
    "loss_free_proportional": _moekit.BalanceRule.proportional,
}


class _MoEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module, *params):  # noqa: ARG004 - params carry the graph edges
        core = module._core
        xd = x.detach()
        if not xd.is_contiguous():
            xd = xd.contiguous()
        shape = xd.shape
        y, saved = core.forward_train(xd.reshape(-1, shape[-1]), module.keep_pre_activations)
        ctx.saved_moe = saved
        ctx.module = module
        ctx.x_dtype = x.dtype
        ctx.aux_dlogits = None
        if module.training:
            if module._balancer is not None:
                module._balancer.count(saved)
            if module._aux_wanted:
                losses, dlogits = _moekit.aux_losses(
                    module._core.config.router,
                    saved.logits,
                    saved.ids,
                    switch_coef=module.aux_coef,
                    seq_coef=module.seq_aux_coef,
                    z_coef=module.z_coef,
                )
                module.aux_loss = losses["total"]
                ctx.aux_dlogits = dlogits
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        module = ctx.module
        d = dy.detach()
        if d.dtype not in (torch.float32, torch.bfloat16):
            d = d.float()
        d = d.contiguous().reshape(-1, d.shape[-1])
        dx, grads = module._core.backward(ctx.saved_moe, d, ctx.aux_dlogits)
        ctx.saved_moe = None
        dx = dx.reshape(dy.shape).to(ctx.x_dtype)
        return (dx, None, *[grads.get(name) for name in module._names])


class MoE(torch.nn.Module):
    """An MoE block (router, routed and shared experts of any moekit family) trained by moekit.

    Build it from a config (fresh weights from ``seed``), or from a loaded layer
    (``MoE.from_checkpoint(path, layer)``: an f32 copy of its weights).

    balance: None/"none", "loss_free_sign" or "loss_free_proportional" (needs a selection bias:
    ``preset_config(..., selection_bias=True)`` or a family that has one); bias_rate is u.
    aux_coef / seq_aux_coef / z_coef: the Switch load loss, DeepSeek-V3's sequence-wise loss
    (the whole batch one sequence) and the router z-loss.
    """

    def __init__(
        self,
        config: _moekit.MoeConfig | None = None,
        *,
        seed: int = 0,
        core: _moekit.TrainableMoe | None = None,
        balance: str | None = None,
        bias_rate: float = 1e-3,
        aux_coef: float = 0.0,
        seq_aux_coef: float = 0.0,
        z_coef: float = 0.0,
        keep_pre_activations: bool = True,
    ):
        super().__init__()
        if (config is None) == (core is None):
            raise ValueError("[moekit.torch.MoE] give exactly one of config and core")
        if balance not in _BALANCE:
            raise ValueError(
                f"[moekit.torch.MoE] balance must be one of {sorted(k for k in _BALANCE if k)}, got {balance!r}"
            )
        self._core = core if core is not None else _moekit.TrainableMoe(config, seed)
        cfg = self._core.config
        self.keep_pre_activations = keep_pre_activations
        self.aux_coef, self.seq_aux_coef, self.z_coef = float(aux_coef), float(seq_aux_coef), float(z_coef)
        self._aux_wanted = self.aux_coef > 0 or self.seq_aux_coef > 0 or self.z_coef > 0
        self.aux_loss = 0.0
        self._names = []
        self._pointers = {}
        for name, tensor in self._core.parameters("torch").items():
            attr = name.replace(".", "_")
            self.register_parameter(attr, torch.nn.Parameter(tensor))
            self._names.append(name)
            self._pointers[attr] = tensor.data_ptr()
        bias = self._core.selection_bias("torch")
        if bias is not None:
            self.register_buffer("selection_bias", bias)
            self._pointers["selection_bias"] = bias.data_ptr()
        rule = _BALANCE[balance]
        if rule is not None and bias is None:
            raise ValueError(
                f"[moekit.torch.MoE] balance={balance!r} needs a selection bias, and {cfg.model_type}'s "
                "router has none: build the config with preset_config(..., selection_bias=True)"
            )
        self._balancer = None if rule is None else _moekit.LoadBalancer(cfg.router.num_experts, rule, bias_rate)
        self._bias_step = 0

    @classmethod
    def from_checkpoint(cls, path: str, layer: int, **kwargs) -> MoE:
        """An f32 trainable copy of decoder layer ``layer``'s MoE block in the folder ``path``."""
        return cls(core=_moekit.TrainableMoe.from_layer(_moekit.load_moe_layer(path, layer)), **kwargs)

    @property
    def config(self) -> _moekit.MoeConfig:
        return self._core.config

    def _check_shared(self):
        for attr, ptr in self._pointers.items():
            t = getattr(self, attr)
            if t.data_ptr() != ptr or t.device.type != "cpu" or t.dtype != torch.float32:
                raise RuntimeError(
                    f"[moekit.torch.MoE] {attr} no longer shares memory with the moekit block "
                    f"(now {t.dtype} on {t.device}): it was moved or converted; moekit's parameters stay "
                    "float32 on the CPU and are updated in place"
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_shared()
        params = [getattr(self, name.replace(".", "_")) for name in self._names]
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            return _MoEFunction.apply(x, self, *params)
        xd = x.detach()
        shape = xd.shape
        return self._core.forward(xd.contiguous().reshape(-1, shape[-1])).reshape(shape)

    def update_bias(self, step: int | None = None) -> dict | None:
        """One loss-free balancing update from the counts of the training forwards since the last
        one (call it after optimizer.step()); returns what it did, None without a balancer."""
        if self._balancer is None:
            return None
        s = self._bias_step if step is None else step
        u = self._balancer.update(self._core, s)
        self._bias_step = s + 1
        return u.as_dict()

    def extra_repr(self) -> str:
        c = self._core.config
        return (
            f"{c.model_type}, D={c.hidden_size}, E={c.router.num_experts}, K={c.router.top_k}, "
            f"F={c.expert_width}, shared_width={c.shared_width}"
        )


def update_biases(model: torch.nn.Module) -> list:
    """update_bias() on every moekit MoE block inside ``model``; returns their reports."""
    return [m.update_bias() for m in model.modules() if isinstance(m, MoE) and m._balancer is not None]
