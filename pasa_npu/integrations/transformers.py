"""PASA as a transformers attention implementation, ``"pasa"``.

Importing this module registers it with transformers' ``AttentionInterface``, together
with its mask function in ``AttentionMaskInterface`` (without one, transformers hands a
custom implementation no mask at all). Then::

    import pasa_npu.integrations.transformers
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16,
                                                 attn_implementation="pasa")
    model.set_attn_implementation("pasa")            # or switch a loaded model

Masks: the mask function is SDPA's (bool, True = attend; None where a plain causal mask
will do), so the attention sees causal, padding (left padding of batched generation
included) and sliding-window masks as SDPA would. Key/value heads of GQA models go to
the operator as they are, not repeated. Prefill and cached decode (``generate``) both
run through :func:`pasa_npu.fused_attention`; gpt-oss's attention sinks (``s_aux``) are
applied from its LSE.

Options, read from the model config at every call: ``config.pasa_algorithm`` (default
``pasa-exact``) and ``config.pasa_backend`` (default ``auto``: the device's backend).
:func:`configure` sets them on a loaded model.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ._attention import (DEFAULT_ALGORITHM, DEFAULT_BACKEND, attend, check_options,
                         import_library, masked_positions)

__all__ = ["ATTENTION_NAME", "pasa_attention_forward", "mask_function", "options", "configure",
           "register_attention", "mask_function_of", "masked_positions"]

_transformers = import_library("transformers")
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import (ALL_MASK_ATTENTION_FUNCTIONS,  # noqa: E402
                                        AttentionMaskInterface, sdpa_mask)

ATTENTION_NAME = "pasa"

#: Attention keywords some models pass that PASA attention cannot honour, with the reason.
_UNSUPPORTED = {"softcap": "the operator has no soft-capping of scores",
                "sinks": "sinks per query token are not supported (s_aux, one per head, is)",
                "position_bias": "the operator has no additive bias input",
                "head_mask": "the operator has no mask per head"}


def pasa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                           scaling: Optional[float] = None, dropout: float = 0.0,
                           **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, N, S1, D), key and value
    (B, Nkv, S2, D), the mask from :data:`mask_function`, ``s_aux``: gpt-oss's sinks, one
    logit per query head (:func:`~pasa_npu.integrations._attention.attend`); returns
    ((B, S1, N, D), None). A row that sees no key (a left-padding query) returns 0."""
    for name, why in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attention keyword {name!r} is not supported by PASA "
                                      f"attention: {why}")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("PASA attention returns no attention weights "
                                  "(output_attentions=True)")
    if dropout:
        raise NotImplementedError(f"PASA attention has no dropout, got dropout={dropout}")
    algorithm, backend = options(getattr(module, "config", None))
    batch, heads, q_len, head_dim = query.shape
    masked = None
    if attention_mask is not None:
        # the mask carries causality and any sliding window
        masked = masked_positions(attention_mask, batch, heads, q_len, key.shape[2])
        causal = False
    else:
        is_causal = kwargs.get("is_causal")
        causal = q_len > 1 and (getattr(module, "is_causal", True) if is_causal is None
                                else bool(is_causal))
    out = attend(query, key, value, layout="BNSD", masked=masked, causal=causal,
                 scale=head_dim ** -0.5 if scaling is None else scaling,
                 algorithm=algorithm, backend=backend, sink=kwargs.get("s_aux"))
    return out, None


#: The mask function registered with the attention: SDPA's.
mask_function = sdpa_mask


def options(config) -> tuple[str, str]:
    """(algorithm, backend) from ``config.pasa_algorithm`` and ``config.pasa_backend``,
    defaults where unset."""
    algorithm = getattr(config, "pasa_algorithm", None) or DEFAULT_ALGORITHM
    backend = getattr(config, "pasa_backend", None) or DEFAULT_BACKEND
    check_options(algorithm, backend, "config.pasa_algorithm / config.pasa_backend:")
    return algorithm, backend


def configure(model: torch.nn.Module, algorithm: Optional[str] = None,
              backend: Optional[str] = None) -> None:
    """Set ``pasa_algorithm`` / ``pasa_backend`` (those given) on every config of
    ``model`` (a multimodal model's sub-configs included)."""
    check_options(algorithm or DEFAULT_ALGORITHM, backend or DEFAULT_BACKEND, "configure():")
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules())
               if isinstance(c, _transformers.PreTrainedConfig)}
    for config in configs.values():
        if algorithm is not None:
            config.pasa_algorithm = algorithm
        if backend is not None:
            config.pasa_backend = backend


def mask_function_of(implementation: str) -> Callable:
    """The mask function transformers pairs with ``implementation`` (``eager``, ``sdpa``,
    ...), or SDPA's where it pairs none."""
    try:
        return ALL_MASK_ATTENTION_FUNCTIONS[implementation]
    except KeyError:
        return mask_function


def register_attention(name: str, attention: Callable, mask: Optional[Callable] = None) -> None:
    """Register ``attention`` under ``name`` with transformers, and ``mask`` (default:
    SDPA's mask function) as its mask function, so that ``set_attn_implementation(name)``
    gives the attention the model's mask."""
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask if mask is not None else mask_function)


register_attention(ATTENTION_NAME, pasa_attention_forward)
