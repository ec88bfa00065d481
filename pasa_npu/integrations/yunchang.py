"""PASA as the local attention of yunchang (``pip install yunchang``, the repository
feifeibear/long-context-attention): Ulysses, ring and USP sequence parallelism with
:func:`pasa_npu.fused_attention` per step.

yunchang's extension point: its ring loops take the local attention from
``select_flash_attn_impl(attn_type, stage="fwd-only", attn_processor=...)``, which returns
``attn_processor`` itself when ``attn_type`` names none of its built-in kernels. The rings
that forward ``attn_processor`` (``ring_impl_type`` ``"basic"`` and ``"basic_flashinfer"``
in yunchang 0.6.4) call it flash-attn style, once per ring step::

    block_out, block_lse = fn(q, k, v, dropout_p=..., softmax_scale=...,
                              causal=causal and step == 0, window_size=..., softcap=...,
                              alibi_slopes=..., return_softmax=...)

with q/k/v (B, S, H, D) and expects ``block_out`` (B, S, H, D) and ``block_lse`` (B, H, S)
fp32, which it merges with ``update_out_and_lse``. :func:`pasa_flash_attn_forward` is that
function. ``UlyssesAttention`` picks its function once, in ``__init__``, into ``attn_fn``;
:func:`ulysses_attention` sets that attribute. Forward only: yunchang's backward calls its own
kernels (PASA is an inference attention, as torch_npu's fused_infer_attention_score), so
both modules refuse inputs that require grad, before any communication; so too a
``window_size`` over a ring of more than one rank (yunchang's ring would give every step the
window in the step's own coordinates) and head counts the Ulysses degree does not divide.

``import pasa_npu`` does not import yunchang; this module does (it needs no flash-attn).
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist

from ..api import fused_attention
from ..masks import compressed_causal_mask

__all__ = ["pasa_flash_attn_forward", "long_context_attention", "ulysses_attention"]

_MASKS: dict = {}
#: yunchang's rings that pass ``attn_processor`` to their steps
_FORWARDING_RINGS = ("basic", "basic_flashinfer")


def pasa_flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            dropout_p: float = 0.0, softmax_scale: float | None = None,
                            causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                            alibi_slopes=None, return_softmax: bool = False,
                            deterministic: bool = False, return_attn_probs: bool = False,
                            **pasa_keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn's ``_flash_attn_forward`` contract, computed by :func:`fused_attention`.

    q (B, S1, Nq, D), k/v (B, S2, Nkv, D) (GQA when Nkv < Nq); ``causal`` and
    ``window_size`` aligned to the bottom right as flash-attn's (sparse_mode 3 / 4).
    Returns (out (B, S1, Nq, Dv) in q's dtype, lse (B, Nq, S1) float32); a row with no key
    gets LSE -inf (so yunchang's merge gives it no weight). ``pasa_keywords``:
    fused_attention's own (``algorithm``, ``beta``, ``backend``, ``inner_precise`` ...).
    """
    if dropout_p:
        raise NotImplementedError("dropout is not implemented by pasa_npu")
    if softcap:
        raise NotImplementedError("softcap is not implemented by pasa_npu")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes are not implemented by pasa_npu")
    if return_softmax or return_attn_probs:
        raise NotImplementedError("return_softmax/return_attn_probs (the attention "
                                  "probabilities) are not implemented by pasa_npu")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    left, right = (-1, -1) if window_size is None else window_size
    if causal:
        right = 0
    band = {}
    if left >= 0 or right >= 0:
        band = {"sparse_mode": 4 if left >= 0 or right > 0 else 3, "atten_mask": _mask(q.device)}
        if band["sparse_mode"] == 4:
            band.update(pre_tokens=left if left >= 0 else 2147483647,
                        next_tokens=right if right >= 0 else 2147483647)
    out, lse = fused_attention(q, k, v, num_heads=q.shape[2], num_key_value_heads=k.shape[2],
                               input_layout="BSND", scale=float(softmax_scale),
                               softmax_lse_flag=True, **band, **pasa_keywords)
    lse = lse.squeeze(-1)
    return out, torch.where(lse == float("inf"), float("-inf"), lse)


def long_context_attention(ring_impl_type: str = "basic", **pasa_keywords):
    """``yunchang.LongContextAttention`` (USP: Ulysses over ``PROCESS_GROUP.ULYSSES_PG``,
    ring over ``RING_PG``, set by ``yunchang.set_seq_parallel_pg``) with PASA as the
    local attention of every ring step. ``ring_impl_type``: ``"basic"`` or
    ``"basic_flashinfer"`` (the rings that take a custom attention). ``pasa_keywords`` as
    :func:`pasa_flash_attn_forward`'s. Its ``forward(q, k, v, softmax_scale=..., causal=...)``
    takes (B, S/P, H, D) shards; ``window_size`` needs a ring of one rank."""
    from yunchang import LongContextAttention
    from yunchang.hybrid.utils import RING_IMPL_DICT
    if ring_impl_type not in RING_IMPL_DICT:
        raise ValueError(f"unknown ring_impl_type {ring_impl_type!r}; yunchang's are "
                         f"{sorted(RING_IMPL_DICT)}, of which {list(_FORWARDING_RINGS)} take a "
                         f"custom attention")
    if ring_impl_type not in _FORWARDING_RINGS:
        raise NotImplementedError(f"yunchang's {ring_impl_type!r} ring does not forward a "
                                  f"custom attention (attn_processor); use one of "
                                  f"{list(_FORWARDING_RINGS)}")
    local = functools.partial(pasa_flash_attn_forward, **pasa_keywords)
    module = LongContextAttention(ring_impl_type=ring_impl_type, attn_type=None,
                                  attn_processor=local)
    module.register_forward_pre_hook(functools.partial(
        _check_call, inspect.signature(module.forward), module.ulysses_pg, True, module.ring_pg),
        with_kwargs=True)
    return module


def ulysses_attention(sequence_process_group=None, **pasa_keywords):
    """``yunchang.UlyssesAttention`` over ``sequence_process_group`` with PASA as its local
    attention (it is built with the torch kernel, then its ``attn_fn`` replaced)."""
    from yunchang import UlyssesAttention
    from yunchang.kernels import AttnType
    module = UlyssesAttention(sequence_process_group, attn_type=AttnType.TORCH_MATH)
    module.attn_fn = functools.partial(pasa_flash_attn_forward, **pasa_keywords)
    module.register_forward_pre_hook(functools.partial(
        _check_call, inspect.signature(module.forward), sequence_process_group, False, None),
        with_kwargs=True)
    return module


def _check_call(forward: inspect.Signature, ulysses_pg, has_ring: bool, ring_pg, module, args,
                kwargs):
    """Refuse, before any communication, a forward call PASA cannot serve (module docstring);
    ``forward``: the module's forward's signature; a group None is the default group, as in
    yunchang."""
    call = forward.bind(*args, **kwargs)
    call.apply_defaults()
    given = call.arguments
    tensors = [given[name] for name in ("query", "key", "value")]
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise NotImplementedError("PASA attention is forward only (no backward): run yunchang's "
                                  "attention under torch.no_grad() or torch.inference_mode()")
    if given["return_attn_probs"]:
        raise NotImplementedError("return_attn_probs (the attention probabilities) is not "
                                  "implemented by pasa_npu")
    window = given["window_size"]
    if has_ring and window is not None and tuple(window) != (-1, -1):
        ring = dist.get_world_size(ring_pg)
        if ring > 1:
            raise NotImplementedError(f"window_size {tuple(window)} over a ring of {ring} ranks "
                                      f"is not implemented (yunchang's ring gives every step "
                                      f"the window in the step's own coordinates); use a ring "
                                      f"degree of 1 (Ulysses only)")
    ulysses = dist.get_world_size(ulysses_pg)
    for name, t in zip(("query", "key", "value"), tensors):
        if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[2] % ulysses:
            raise ValueError(f"{name} has {t.shape[2]} heads, which the Ulysses degree "
                             f"{ulysses} does not divide: yunchang's all-to-all splits every "
                             f"tensor's heads evenly over the Ulysses group (for key/value, "
                             f"repeat the KV heads to a multiple of {ulysses})")


def _mask(device) -> torch.Tensor:
    key = str(device)
    if key not in _MASKS:
        _MASKS[key] = compressed_causal_mask(device)
    return _MASKS[key]
