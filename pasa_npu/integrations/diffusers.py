"""PASA for diffusers: a backend of the attention dispatcher, ``"pasa"``, and
:class:`PasaAttnProcessor` for models built on the classic ``Attention`` class.

Importing this module registers the backend. Models whose attention goes through
diffusers' dispatcher (``dispatch_attention_fn``: the video and image transformers)::

    import pasa_npu.integrations.diffusers
    transformer.set_attention_backend("pasa")
    with attention_backend("pasa"):          # diffusers.attention_dispatch
        ...

Models on the classic ``Attention`` class (the UNets, Stable Video Diffusion's among
them), whose default processor calls SDPA directly::

    unet.set_attn_processor(PasaAttnProcessor())

Both take self- and cross-attention and diffusers' masks: bool (True attends) or additive
(0 attends, -10000 or lower masks), per key or per query and key, the same for every
head. Inputs must be float16 or bfloat16 (PASA computes in fp16). Forward only.

Options: :func:`configure` sets the dispatcher backend's algorithm (default
``pasa-exact``) and pasa_npu backend (default ``auto``: the device's);
``PasaAttnProcessor(algorithm=..., backend=...)`` takes its own.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._attention import (DEFAULT_ALGORITHM, DEFAULT_BACKEND, attend, check_options,
                         import_library, masked_positions)

import_library("diffusers")
from diffusers.models import attention_dispatch as _dispatch  # noqa: E402

BACKEND_NAME = "pasa"

#: The dispatcher backend's options (see :func:`configure`).
_OPTIONS = {"algorithm": DEFAULT_ALGORITHM, "backend": DEFAULT_BACKEND}


def configure(algorithm: Optional[str] = None, backend: Optional[str] = None) -> dict:
    """Set the dispatcher backend's ``algorithm`` and pasa_npu ``backend`` (those given);
    returns the previous options."""
    previous = dict(_OPTIONS)
    new = {"algorithm": algorithm or _OPTIONS["algorithm"],
           "backend": backend or _OPTIONS["backend"]}
    check_options(new["algorithm"], new["backend"], "configure():")
    _OPTIONS.update(new)
    return previous


def pasa_dispatch_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                            is_causal: bool = False, scale: Optional[float] = None,
                            enable_gqa: bool = False, return_lse: bool = False,
                            _parallel_config=None) -> torch.Tensor:
    """The dispatcher's backend contract: query (B, S1, N, D), key and value (B, S2, Nkv, D)
    (Nkv < N with ``enable_gqa``), SDPA's mask and ``is_causal``; returns (B, S1, N, D)."""
    if _parallel_config is not None:
        raise NotImplementedError("the pasa attention backend has no context parallelism")
    if return_lse:
        raise NotImplementedError("the pasa attention backend does not return the LSE "
                                  "(return_lse=True)")
    if dropout_p:
        raise NotImplementedError(f"the pasa attention backend has no dropout, got "
                                  f"dropout_p={dropout_p}")
    batch, q_len, heads, head_dim = query.shape
    kv_len, kv_heads = key.shape[1], key.shape[2]
    if kv_heads != heads and not enable_gqa:
        raise ValueError(f"key has {kv_heads} heads and query {heads}: pass enable_gqa=True "
                         f"for grouped-query attention")
    masked = None
    if attn_mask is not None:
        if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (batch, kv_len):
            attn_mask = attn_mask[:, None, None, :]  # diffusers' per-key form (B, S2)
        masked = masked_positions(attn_mask, batch, heads, q_len, kv_len)
    return attend(query, key, value, layout="BSND", masked=masked, causal=is_causal,
                  scale=head_dim ** -0.5 if scale is None else scale, **_OPTIONS)


class PasaAttnProcessor:
    """A processor for diffusers' classic ``Attention``: the steps of its default SDPA
    processor (spatial and group norms, cross-attention with ``norm_cross``, per-head
    query/key norms, residual connection, output rescaling) with the attention computed
    by :func:`pasa_npu.fused_attention` at ``attn.scale``."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM, backend: str = DEFAULT_BACKEND):
        check_options(algorithm, backend, "PasaAttnProcessor:")
        self.algorithm = algorithm
        self.backend = backend

    def __call__(self, attn, hidden_states: torch.Tensor,
                 encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 temb: Optional[torch.Tensor] = None,
                 image_rotary_emb=None, ip_adapter_masks=None,
                 ip_hidden_states=None) -> torch.Tensor:
        _refuse_unsupported(attn, encoder_hidden_states, image_rotary_emb=image_rotary_emb,
                            ip_adapter_masks=ip_adapter_masks, ip_hidden_states=ip_hidden_states)
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        image_shape = hidden_states.shape if hidden_states.dim() == 4 else None
        if image_shape is not None:  # (B, C, H, W) -> (B, H * W, C)
            hidden_states = hidden_states.flatten(2).transpose(1, 2)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        batch, kv_len = encoder_hidden_states.shape[:2]

        query = attn.to_q(hidden_states)
        head_dim = query.shape[-1] // attn.heads
        query = query.unflatten(-1, (attn.heads, head_dim))
        key = attn.to_k(encoder_hidden_states).unflatten(-1, (-1, head_dim))
        value = attn.to_v(encoder_hidden_states).unflatten(-1, (key.shape[2], -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        masked = None
        if attention_mask is not None:
            mask = attn.prepare_attention_mask(attention_mask, kv_len, batch)
            mask = mask.view(batch, attn.heads, -1, mask.shape[-1])
            masked = masked_positions(mask, batch, attn.heads, query.shape[1], kv_len)
        out = attend(query, key, value, layout="BSND", masked=masked, causal=False,
                     scale=attn.scale, algorithm=self.algorithm, backend=self.backend)

        hidden_states = attn.to_out[1](attn.to_out[0](out.flatten(2)))
        if image_shape is not None:
            hidden_states = hidden_states.transpose(1, 2).reshape(image_shape)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


#: the classic Attention's parts the SDPA processor steps do not cover
_ADDED_PROJECTIONS = ("add_q_proj", "add_k_proj", "add_v_proj")


def _refuse_unsupported(attn, encoder_hidden_states, **extras) -> None:
    """Refuse what :class:`PasaAttnProcessor` would leave out: an ``Attention`` with added
    key/value projections (joint or added-KV attention), IP-Adapter's image embeddings and
    masks, and rotary embeddings (named, so that diffusers passes them rather
    than dropping them with a log line)."""
    for name in _ADDED_PROJECTIONS:
        if getattr(attn, name, None) is not None:
            raise NotImplementedError(
                f"PasaAttnProcessor does not implement attention with added key/value "
                f"projections ({type(attn).__name__}.{name}); keep this module's own "
                f"processor, or use the 'pasa' attention backend where the model supports it")
    if isinstance(encoder_hidden_states, (tuple, list)):
        raise NotImplementedError("PasaAttnProcessor does not implement IP-Adapter image "
                                  "embeddings (encoder_hidden_states as a tuple)")
    given = sorted(name for name, value in extras.items() if value is not None)
    if given:
        raise NotImplementedError(f"PasaAttnProcessor does not take {', '.join(given)} (the "
                                  f"steps of diffusers' default processor only); keep this "
                                  f"module's own processor")


def _backend_member():
    """diffusers' ``AttentionBackendName`` member for ``"pasa"``. The dispatcher accepts
    only members of that enum and has no call to add one, so the member is added to the
    enum's tables as the enum machinery itself would."""
    names = _dispatch.AttentionBackendName
    member = names._value2member_map_.get(BACKEND_NAME)
    if member is not None:
        return member
    member = str.__new__(names, BACKEND_NAME)
    member._name_, member._value_ = BACKEND_NAME.upper(), BACKEND_NAME
    member._sort_order_ = len(names._member_names_)
    member.__objclass__ = names
    names._member_map_[member._name_] = member
    names._member_names_.append(member._name_)
    names._value2member_map_[BACKEND_NAME] = member
    type.__setattr__(names, member._name_, member)
    return member


_dispatch._AttentionBackendRegistry.register(_backend_member())(pasa_dispatch_attention)
