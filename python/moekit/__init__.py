"""moekit: exact Mixture-of-Experts blocks of every model family, fast on the CPU.

The C++ core (``moekit._moekit``) with the same names as in C++::

    import numpy as np, moekit
    layer = moekit.load_moe_layer("path/to/checkpoint", layer=1)
    y = layer.forward(np.random.randn(4, layer.config.hidden_size).astype(np.float32))
    y, ids, weights, logits = layer.forward(x, return_routing=True)

Arrays: numpy arrays and DLPack tensors (``torch.Tensor`` included) go in without a copy when
they are C-contiguous float32/bfloat16 CPU memory (anything else contiguous-but-strided is copied
once); results come back in the caller's library (numpy in, numpy out; torch in, torch out) and
own their memory. Errors: ValueError (bad shapes, dtypes, configs, NaN/Inf), IndexError (a layer
or id out of range), RuntimeError (files), TypeError (not an array), each with moekit's message.
The GIL is released while moekit computes; forwards from several Python threads are safe.

``moekit.torch.MoE`` is a ``torch.nn.Module`` that trains through moekit's backward.
"""

from ._moekit import (  # noqa: F401
    BalanceRule,
    BalanceUpdate,
    BodyKind,
    GroupMode,
    LmTrainer,
    LoadBalancer,
    MaskFill,
    MoeConfig,
    MoeLayer,
    Model,
    Renorm,
    Sampler,
    Sequence,
    TextStream,
    RouterConfig,
    SavedForward,
    ScoreFunc,
    TrainableMoe,
    WeightsFrom,
    aux_losses,
    expert_counts,
    inspect,
    load_config,
    load_hf_config,
    load_metrics,
    load_moe_layer,
    max_violation,
    num_threads,
    parse_hf_config,
    preset_config,
    quantize_checkpoint,
    route,
    router_logits,
    set_num_threads,
    stored_tensors,
    supported_model_types,
)

__version__ = "0.1.0"


def weights_as_bf16(array):
    """A numpy uint16 array of bfloat16 bits (how MoeLayer.weights shows bf16 tensors) viewed
    as ml_dtypes.bfloat16, without a copy. Raises ImportError where ml_dtypes is missing."""
    import ml_dtypes  # noqa: PLC0415 - optional dependency

    return array.view(ml_dtypes.bfloat16)


__all__ = [name for name in dir() if not name.startswith("_")]
