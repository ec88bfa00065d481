"""What the Hugging Face integrations share: their libraries' import, the options,
masks in PyTorch SDPA's convention turned into pasa_npu's, and one attention call.

SDPA's convention, used by transformers and diffusers alike: a bool mask attends where
True; a float mask is added to the scores. pasa_npu's operator takes no additive bias,
so a float mask may hold only 0 (attend) and fills at or below ``MASK_FILL_LIMIT``
(masked): diffusers fills with -10000, transformers with the dtype's lowest value or
-inf. Any other value is refused.
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch

from ..api import compressed_causal_mask, fused_attention
from .. import backends
from ..numerics import ALGORITHM_NAMES
from ..options import check_sink_tensor

HF_EXTRA = "pip install 'pasa-npu[hf]'"
DEFAULT_ALGORITHM = "pasa-exact"
DEFAULT_BACKEND = "auto"
MASK_FILL_LIMIT = -1e4

_CAUSAL_MASKS: dict = {}  # device -> torch_npu's compressed causal mask


def import_library(name: str):
    """``import name``, or an ImportError that says which extra installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"pasa_npu.integrations.{name} needs {name}, which is not "
                          f"installed: {HF_EXTRA}") from exc


def check_options(algorithm, backend, where: str) -> None:
    """Refuse an algorithm or backend pasa_npu does not know, naming where it was set."""
    if algorithm not in ALGORITHM_NAMES:
        raise ValueError(f"{where} algorithm must be one of {ALGORITHM_NAMES}, got {algorithm!r}")
    try:
        backends.check_name(backend)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from None


def masked_positions(mask: torch.Tensor, batch: int, heads: int, q_len: int,
                     kv_len: int) -> torch.Tensor:
    """``mask`` (SDPA's convention, broadcastable to (batch, heads, q_len, kv_len)) as a
    bool (batch or 1, q_len, kv_len) tensor, True = masked. The mask must be the same for
    every head: the operator takes one mask for all heads."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention mask must be a tensor or None, got {type(mask).__name__}")
    if not 2 <= mask.dim() <= 4:
        raise ValueError(f"attention mask must have 2 to 4 dims, got shape {tuple(mask.shape)}")
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    for axis, (size, want) in enumerate(zip(m.shape, (batch, heads, q_len, kv_len))):
        if size not in (1, want):
            raise ValueError(f"attention mask of shape {tuple(mask.shape)} does not broadcast "
                             f"to (batch, heads, query, key) = {(batch, heads, q_len, kv_len)}")
    if m.shape[1] > 1:
        if not torch.equal(m, m[:, :1].expand_as(m)):
            raise NotImplementedError("the attention mask differs between heads; pasa_npu's "
                                      "operator takes one mask for all heads")
    m = m[:, 0]
    if m.dtype == torch.bool:
        masked = ~m
    elif m.dtype.is_floating_point:
        masked = m <= MASK_FILL_LIMIT
        if bool((m.masked_fill(masked, 0) != 0).any()):
            raise ValueError(f"the float attention mask adds a bias (values other than 0 and "
                             f"fills <= {MASK_FILL_LIMIT:g}); pasa_npu's operator has no "
                             f"additive bias input")
    else:
        raise TypeError(f"attention mask must be bool or floating point, got {m.dtype}")
    return masked.expand(m.shape[0], q_len, kv_len)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, layout: str,
           masked: Optional[torch.Tensor], causal: bool, scale: float, algorithm: str,
           backend: str, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of query (B, N, S1, D) or (B, S1, N, D) (``layout`` BNSD or BSND) over
    key and value with N or fewer heads (GQA, not repeated), through
    :func:`pasa_npu.fused_attention`. Returns (B, S1, N, Dv) in the input dtype.

    ``masked``: bool, broadcastable to (B or 1, S1, S2), True = masked, or None.
    ``causal``: SDPA's ``is_causal``, aligned to the upper left (row i sees keys 0..i). A
    row that sees no key returns 0.

    ``sink``: (N,) float logits, one per query head, each joining its head's softmax
    denominator as a key with a zero value (gpt-oss's sinks), or None. Applied from the
    call's fp32 LSE, for every layout, mask and backend: with Σ = e^LSE over the keys,
    out · Σ / (Σ + e^sink) = out · σ(LSE − sink), computed in fp32 and rounded once more to
    the output dtype (half an ulp of the output; a row that sees no key stays 0)."""
    _check_inputs(query, key, value, sink)
    heads_axis, seq_axis = (1, 2) if layout == "BNSD" else (2, 1)
    if sink is not None:
        check_sink_tensor(sink, query.shape[heads_axis], query.device, "attention sinks")
    q_len, kv_len = query.shape[seq_axis], key.shape[seq_axis]
    if masked is not None:
        masked = masked.expand(masked.shape[0], q_len, kv_len)
    # a causal prefill runs as torch_npu's upper-left causal mode (no S1 x S2 mask)
    causal_mode = causal and masked is None and 1 < q_len <= kv_len
    if causal and not causal_mode:
        upper = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).triu(1)
        masked = upper[None] if masked is None else masked | upper
    out, lse = fused_attention(
        query, key, value, atten_mask=_compressed_causal_mask(query.device) if causal_mode
        else masked, sparse_mode=2 if causal_mode else 0,
        num_heads=query.shape[heads_axis], num_key_value_heads=key.shape[heads_axis],
        scale=float(scale), input_layout="BNSD_BSND" if layout == "BNSD" else "BSND",
        inner_precise=2 if q_len > 1 else 0, softmax_lse_flag=sink is not None,
        algorithm=algorithm, backend=backend)
    if sink is not None:  # lse: (B, N, S1, 1); out: (B, S1, N, Dv)
        out = (out.float() * kept_by_sink(lse, sink).transpose(1, 2)).to(out.dtype)
    if q_len == 1 and masked is not None:  # decode takes no row-invalid bit: zero them here
        out = out.masked_fill(masked.all(-1)[:, :, None, None], 0)
    return out


def kept_by_sink(lse: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """The share of each row's softmax mass its keys keep when the sink joins the
    denominator as a key with a zero value: with Σ = e^LSE over the keys, Σ / (Σ + e^sink)
    = σ(LSE − sink). ``lse`` (B, N, S1, 1), ``sink`` (N,); computed in the LSE's dtype."""
    return torch.sigmoid(lse - sink.to(lse.dtype)[:, None, None])


def _check_inputs(query, key, value, sink=None) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"PASA attention takes float16 or bfloat16 tensors (it computes in "
                            f"fp16); the model gave {name} in {t.dtype}: load or cast the "
                            f"model to torch.float16")
    tensors = (query, key, value) if sink is None else (query, key, value, sink)
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise NotImplementedError("PASA attention is forward only (no backward): run the model "
                                  "under torch.no_grad() or torch.inference_mode()")


def _compressed_causal_mask(device: torch.device) -> torch.Tensor:
    mask = _CAUSAL_MASKS.get(device)
    if mask is None:
        mask = _CAUSAL_MASKS[device] = compressed_causal_mask(device)
    return mask
