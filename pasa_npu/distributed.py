"""Sequence-parallel attention over ``torch.distributed``: ring attention with
:func:`pasa_npu.fused_attention` as the local attention.

**Sharding.** The sequence is split into contiguous shards, one per rank of ``group`` in
group-rank order: rank ``r`` holds the queries, keys and values of global positions
``[offset_r, offset_r + len_r)``, ``offset_r = sum(len_0 .. len_{r-1})``, and receives the
output and LSE of its own queries. ``seq_lens`` gives every rank's ``len_r`` (None: all equal
to this rank's). The same plain contiguous split is used for causal attention (no zigzag
load balancing: rank ``r`` computes ``r + 1`` of the ``W`` steps, the others it skips).

**The ring.** ``W`` steps; at step ``s`` rank ``r`` attends its queries to the K/V shard of
rank ``(r - s) mod W`` while it sends that shard to rank ``r + 1`` and receives the next from
``r - 1`` (``isend``/``irecv`` through ``batch_isend_irecv``, so communication overlaps the
local attention). Each step is one :func:`fused_attention` call, so PASA's shift stays local
to the KV chunk at hand; the partial outputs are merged with their LSEs in fp32.

**Masks.** ``sparse_mode`` 2 and 3 (causal; the global query and key lengths are equal, so
top-left and bottom-right coincide) and 4 (a band of ``pre_tokens``/``next_tokens``) are
global. No mask is built: each step gets the band in its own coordinates through
``sparse_mode=4`` (or 0 where the band covers the whole step; a step the band misses is
skipped). Rows a step's band leaves empty come back from :func:`fused_attention` as 0 with
LSE +inf (its invalid-row convention); the merge counts them as LSE -inf, contributing
nothing. A row no step reaches is returned as fused_attention returns it: 0, LSE +inf.

Works with any process group whose backend has point-to-point ops: gloo (CPU), NCCL (CUDA),
HCCL (NPU).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .api import fused_attention
from .masks import compressed_causal_mask
from .views import to_canonical

__all__ = ["ring_attention", "merge_partial"]

_INT_MAX = 2147483647
_SEQ_DIM = {"BSH": 1, "BSND": 1, "BNSD": 2}
_REFUSED = ("actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "softmax_lse_flag",
            "pse_shift", "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len")
_MASKS: dict = {}


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                   group: dist.ProcessGroup | None = None,
                   input_layout: str = "BSH", sparse_mode: int = 0,
                   pre_tokens: int = _INT_MAX, next_tokens: int = _INT_MAX,
                   atten_mask: torch.Tensor | None = None,
                   seq_lens: Sequence[int] | None = None,
                   **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring attention over the sequence shards of ``group`` (module docstring).

    ``query``/``key``/``value``: this rank's contiguous shard, layout ``BSH``, ``BSND`` or
    ``BNSD``. ``sparse_mode``: 0 (no mask), 2 or 3 (causal), 4 (the band ``pre_tokens`` /
    ``next_tokens``), all over the global sequence; ``atten_mask`` may be None or
    :func:`compressed_causal_mask` (modes 2-4 need no mask here). Every other keyword
    (``num_heads``, ``num_key_value_heads``, ``scale``, ``algorithm``, ``beta``,
    ``backend``, ``inner_precise``, ``kv_block`` ...) goes to each step's
    :func:`fused_attention` unchanged.

    Returns ``(out, lse)`` for this rank's queries: ``out`` in ``input_layout`` and the
    input dtype, ``lse`` float32 (B, N, S_local, 1), as fused_attention's.
    Forward only (no autograd through the ring).
    """
    if input_layout not in _SEQ_DIM:
        raise NotImplementedError(f"ring_attention takes input_layout BSH, BSND or BNSD, "
                                  f"got {input_layout!r}")
    refused = sorted(n for n in _REFUSED if n in keywords)
    if refused:
        raise NotImplementedError(f"ring_attention does not take {refused}: the LSE is always "
                                  f"returned and every shard is dense")
    band = _global_band(sparse_mode, pre_tokens, next_tokens, atten_mask)

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    seq_dim = _SEQ_DIM[input_layout]
    local = query.shape[seq_dim]
    if key.shape[seq_dim] != local or value.shape[seq_dim] != local:
        raise ValueError(f"query, key and value shards must have the same length; got "
                         f"{query.shape[seq_dim]}, {key.shape[seq_dim]}, {value.shape[seq_dim]}")
    lens = [local] * world if seq_lens is None else [int(n) for n in seq_lens]
    if len(lens) != world or lens[rank] != local:
        raise ValueError(f"seq_lens must list the {world} ranks' shard lengths with this "
                         f"rank's ({local}) at position {rank}; got {list(lens)}")
    offsets = [sum(lens[:i]) for i in range(world)]
    send_to = dist.get_global_rank(group, (rank + 1) % world) if group is not None \
        else (rank + 1) % world
    recv_from = dist.get_global_rank(group, (rank - 1) % world) if group is not None \
        else (rank - 1) % world

    keywords = dict(keywords, input_layout=input_layout, softmax_lse_flag=True)
    k_cur, v_cur = key.contiguous(), value.contiguous()
    out = lse = None
    for step in range(world):
        src = (rank - step) % world
        requests = []
        if step + 1 < world:
            coming = lens[(rank - step - 1) % world]
            k_next = k_cur.new_empty(_with_len(k_cur.shape, seq_dim, coming))
            v_next = v_cur.new_empty(_with_len(v_cur.shape, seq_dim, coming))
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k_cur, send_to, group=group),
                dist.P2POp(dist.isend, v_cur, send_to, group=group),
                dist.P2POp(dist.irecv, k_next, recv_from, group=group),
                dist.P2POp(dist.irecv, v_next, recv_from, group=group)])
        step_keywords = _step_band(band, offsets[rank] - offsets[src], local, lens[src],
                                   query.device)
        if step_keywords is not None:
            block_out, block_lse = fused_attention(query, k_cur, v_cur, **keywords,
                                                   **step_keywords)
            out, lse = merge_partial(out, lse, to_canonical(block_out, "attention_out", input_layout,
                                                           block_lse.shape[1]), block_lse)
        for request in requests:
            request.wait()
        if requests:
            k_cur, v_cur = k_next, v_next
    return _finish(out, lse, query, value, input_layout, keywords, seq_dim)


def merge_partial(out: torch.Tensor | None, lse: torch.Tensor | None,
                  block_out: torch.Tensor, block_lse: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a partial attention result into a running one, in fp32.

    ``out``/``block_out``: (B, N, S, D); ``lse``/``block_lse``: (B, N, S, 1). A row with no
    key in that step (LSE -inf, or fused_attention's invalid row: 0 with LSE +inf)
    contributes nothing. A +inf LSE with a non-zero output is an overflowed statistic and
    makes the row NaN, as a NaN anywhere does. Returns the new (out, lse), fp32; a row no
    block has reached so far has out 0 and LSE -inf.
    """
    inf = float("inf")
    block_out = block_out.float()
    block_lse = block_lse.float()
    pos_inf = block_lse == inf
    empty = pos_inf & (block_out == 0).all(-1, keepdim=True)
    block_lse = torch.where(empty, -inf, torch.where(pos_inf, float("nan"), block_lse))
    block_out = torch.where(torch.isnan(block_lse), float("nan"), block_out)
    if out is None:
        return torch.where(block_lse == -inf, 0.0, block_out), block_lse
    top = torch.maximum(lse, block_lse)
    top = torch.where(torch.isinf(top), 0.0, top)  # both -inf: any finite base will do
    a = torch.exp(lse - top)
    b = torch.exp(block_lse - top)
    total = a + b
    safe = torch.where(total > 0, total, 1.0)
    out = out * (a / safe) + torch.where(b > 0, block_out, 0.0) * (b / safe)
    return out, top + torch.log(total)


def _global_band(sparse_mode, pre_tokens, next_tokens, atten_mask):
    """(pre, next) of the global band, top-left coordinates; None for no band."""
    sparse_mode = int(sparse_mode)
    if sparse_mode == 0:
        if atten_mask is not None:
            raise NotImplementedError("ring_attention takes no explicit atten_mask; use "
                                      "sparse_mode 2/3 (causal) or 4 (band)")
        if (pre_tokens, next_tokens) != (_INT_MAX, _INT_MAX):
            raise NotImplementedError("pre_tokens/next_tokens with sparse_mode=0 need a full "
                                      "mask; use sparse_mode=4 for a band")
        return None
    if sparse_mode not in (2, 3, 4):
        raise NotImplementedError(f"ring_attention takes sparse_mode 0, 2, 3 or 4, "
                                  f"got {sparse_mode}")
    if atten_mask is not None and tuple(atten_mask.shape) != (2048, 2048):
        raise NotImplementedError("ring_attention takes atten_mask None or the compressed "
                                  "causal mask (pasa_npu.compressed_causal_mask())")
    if sparse_mode in (2, 3):
        return _INT_MAX, 0
    pre, nxt = int(pre_tokens), int(next_tokens)
    if pre + nxt < 0:
        raise ValueError(f"the band is empty: pre_tokens ({pre}) + next_tokens ({nxt}) < 0")
    return pre, nxt


def _step_band(band, shift: int, s_q: int, s_kv: int, device):
    """One step's band as fused_attention's keywords, ``shift`` = the q shard's offset minus
    the kv shard's: None where the band misses the step (skipped), sparse_mode 0 where it
    covers it, else sparse_mode 4 with the band in the step's own coordinates."""
    if band is None:
        return {"sparse_mode": 0}
    pre, nxt = band
    lo, hi = shift - pre, shift + nxt  # key index - query index, local, within the band
    if hi < -(s_q - 1) or lo > s_kv - 1:
        return None
    if lo <= -(s_q - 1) and hi >= s_kv - 1:
        return {"sparse_mode": 0}
    limit = s_q + s_kv
    pre_tl, nxt_tl = min(-lo, limit), min(hi, limit)  # top-left; sparse_mode 4 counts from
    return {"sparse_mode": 4, "atten_mask": _mask(device),  # the bottom right
            "pre_tokens": pre_tl + s_kv - s_q, "next_tokens": nxt_tl - s_kv + s_q}


def _mask(device) -> torch.Tensor:
    key = str(device)
    if key not in _MASKS:
        _MASKS[key] = compressed_causal_mask(device)
    return _MASKS[key]


def _with_len(shape, dim, n):
    shape = list(shape)
    shape[dim] = n
    return shape


def _finish(out, lse, query, value, layout, keywords, seq_dim):
    if out is None:  # no step reached any row: fused_attention's invalid rows
        heads = int(keywords.get("num_heads", 1))
        b, s = query.shape[0], query.shape[seq_dim]
        kv_heads = int(keywords.get("num_key_value_heads", 0)) or heads
        d_v = value.shape[-1] // kv_heads if layout == "BSH" else value.shape[-1]
        out = query.new_zeros(b, heads, s, d_v, dtype=torch.float32)
        lse = torch.full((b, heads, s, 1), float("-inf"), device=query.device)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)
    out = out.to(query.dtype)
    if layout == "BSND":
        out = out.transpose(1, 2)
    elif layout == "BSH":
        out = out.transpose(1, 2).flatten(2)
    return out.contiguous(), lse
