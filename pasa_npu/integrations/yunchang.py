"""PASA as the local attention of yunchang (``pip install yunchang``, the repository
feifeibear/long-context-attention): Ulysses, ring and USP sequence parallelism with
:func:`pasa_npu.fused_attention` per step.

yunchang's extension point: its ring loops take the local attention from
``select_flash_attn_impl(attn_type, stage="fwd-only", attn_processor=...)``, which returns
``attn_processor`` itself when ``attn_type`` names none of its built-in kernels. The ring
(``ring_impl_type="basic"``, the only one that forwards ``attn_processor`` as of yunchang
0.6.4) calls it flash-attn style, once per ring step::

    block_out, block_lse = fn(q, k, v, dropout_p=..., softmax_scale=...,
                              causal=causal and step == 0, window_size=..., softcap=...,
                              alibi_slopes=..., return_softmax=...)

with q/k/v (B, S, H, D) and expects ``block_out`` (B, S, H, D) and ``block_lse`` (B, H, S)
fp32, which it merges with ``update_out_and_lse``. :func:`pasa_flash_attn_forward` is that
function. ``UlyssesAttention`` picks its function once, in ``__init__``, into ``attn_fn``;
:func:`ulysses_attention` sets that attribute. Forward only: yunchang's backward calls its own
kernels (PASA is an inference attention, as torch_npu's fused_infer_attention_score).

``import pasa_npu`` does not import yunchang; this module does (it needs no flash-attn).
"""
from __future__ import annotations

import functools

import torch

from ..api import fused_attention
from ..masks import compressed_causal_mask

__all__ = ["pasa_flash_attn_forward", "long_context_attention", "ulysses_attention"]

_MASKS: dict = {}


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
    local attention of every ring step. ``pasa_keywords`` as :func:`pasa_flash_attn_forward`'s.
    Its ``forward(q, k, v, softmax_scale=..., causal=...)`` takes (B, S/P, H, D) shards."""
    from yunchang import LongContextAttention
    if ring_impl_type != "basic":
        raise NotImplementedError(f"yunchang's {ring_impl_type!r} ring does not forward a "
                                  f"custom attention (attn_processor); use 'basic'")
    local = functools.partial(pasa_flash_attn_forward, **pasa_keywords)
    return LongContextAttention(ring_impl_type="basic", attn_type=None, attn_processor=local)


def ulysses_attention(sequence_process_group=None, **pasa_keywords):
    """``yunchang.UlyssesAttention`` over ``sequence_process_group`` with PASA as its local
    attention (it is built with the torch kernel, then its ``attn_fn`` replaced)."""
    from yunchang import UlyssesAttention
    from yunchang.kernels import AttnType
    module = UlyssesAttention(sequence_process_group, attn_type=AttnType.TORCH_MATH)
    module.attn_fn = functools.partial(pasa_flash_attn_forward, **pasa_keywords)
    return module


def _mask(device) -> torch.Tensor:
    key = str(device)
    if key not in _MASKS:
        _MASKS[key] = compressed_causal_mask(device)
    return _MASKS[key]
