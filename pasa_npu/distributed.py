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

**Agreement.** Every rank of ``group`` must call with the same arguments. Each rank first
checks its own call, the keywords as :func:`fused_attention` checks them (a plan of its
first step, which then runs that step); then one all_gather of a few int64s shares whether
each rank refused and compares the dtype, layout, heads, batch, head dims, band and
``seq_lens``, before any K/V moves. A rank that refused raises its own error and every
other rank a ValueError naming it; a disagreement raises ValueError on every rank. The
other keywords (``scale``, ``algorithm`` ...) are not compared. The all_gather runs on
``query``'s device; a query on a device type the group's backend does not carry
(``dist.get_backend_config``: CPU tensors on an NCCL group) is a refusal. A refusing rank
gathers on the first of ``query``, ``key``, ``value`` on a carried device, else on the CPU
or the current accelerator, whichever the backend carries; with neither it raises alone,
and the others wait in the all_gather until the group's timeout.

**Masks.** ``sparse_mode`` 2 and 3 (causal; the global query and key lengths are equal, so
top-left and bottom-right coincide) and 4 (a band of ``pre_tokens``/``next_tokens``) are
global. No mask is built: each step gets the band in its own coordinates through
``sparse_mode=4`` (or 0 where the band covers the whole step; a step the band misses is
skipped; a one-query step, which fused_attention runs as decode without a band, attends
the band's keys only). Rows a step's band leaves empty come back from
:func:`fused_attention` as 0 with LSE +inf (its invalid-row convention); the merge counts
them as LSE -inf, contributing nothing. A row no step reaches is returned as
fused_attention returns it: 0, LSE +inf.

Works with any process group whose backend has point-to-point ops and all_gather: gloo
(CPU), NCCL (CUDA), HCCL (NPU).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .api import fused_attention, plan
from .arguments import describe
from .masks import check_mask, check_optimized_mask, compressed_causal_mask
from .options import INT64_MAX, check_tensors, int_arg
from .views import to_canonical

__all__ = ["ring_attention", "merge_partial"]

_INT_MAX = 2147483647
_SEQ_DIM = {"BSH": 1, "BSND": 1, "BNSD": 2}
_REFUSED = ("actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "softmax_lse_flag",
            "pse_shift", "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len")
_MASKS: dict = {}
_DTYPES = (torch.float16, torch.bfloat16)


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
    :func:`compressed_causal_mask` (modes 2-4 need no mask here). ``seq_lens``: every rank's
    shard length (None: all equal). Every other keyword
    (``num_heads``, ``num_key_value_heads``, ``scale``, ``algorithm``, ``beta``,
    ``backend``, ``inner_precise``, ``kv_block`` ...) goes to each step's
    :func:`fused_attention` unchanged.

    Returns ``(out, lse)`` for this rank's queries: ``out`` in ``input_layout`` and the
    input dtype, ``lse`` float32 (B, N, S_local, 1), as fused_attention's. Arguments a rank
    refuses, and shapes, dtypes, band and lengths the ranks disagree on, raise on every
    rank before any K/V is sent (module docstring, "Agreement").
    Forward only: inputs that require grad raise NotImplementedError while grad is enabled.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of group: ring_attention runs on the "
                         "ranks of group only")
    carried = _carried(group)
    try:
        band, seq_dim, local, seq_lens, fields, keywords, first_step = _checked(
            query, key, value, world, carried, input_layout, sparse_mode, pre_tokens,
            next_tokens, atten_mask, seq_lens, keywords)
        refusal = None
    except (TypeError, ValueError, NotImplementedError) as exc:
        refusal, local, fields = exc, 0, None
    lens = _agree(group, world, _gather_device(carried, query, key, value, refusal), seq_lens,
                  local, fields, refusal)
    offsets = [sum(lens[:i]) for i in range(world)]
    send_to = dist.get_global_rank(group, (rank + 1) % world) if group is not None \
        else (rank + 1) % world
    recv_from = dist.get_global_rank(group, (rank - 1) % world) if group is not None \
        else (rank - 1) % world

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
        attended = _step_band(band, offsets[rank] - offsets[src], local, lens[src],
                              query.device)
        if attended is not None:
            step_keywords, keys = attended
            k_step, v_step = (x.narrow(seq_dim, keys.start, keys.stop - keys.start)
                              for x in (k_cur, v_cur))
            if step == 0:  # planned by _checked
                block_out, block_lse = first_step.run(query, k_step, v_step)
            else:
                block_out, block_lse = fused_attention(query, k_step, v_step, **keywords,
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

    ``out``/``block_out``: (B, N, S, D); ``lse``/``block_lse``: (B, N, S, 1) (other shapes
    raise ValueError); ``out`` and ``lse`` both None before the first block. A row with no
    key in that step (LSE -inf, or fused_attention's invalid row: 0 with LSE +inf)
    contributes nothing. A +inf LSE with a non-zero output is an overflowed statistic and
    makes the row NaN, as a NaN anywhere does. Returns the new (out, lse), fp32; a row no
    block has reached so far has out 0 and LSE -inf.
    """
    if block_out.dim() != 4 or block_lse.shape != block_out.shape[:-1] + (1,):
        raise ValueError(f"merge_partial takes block_out (B, N, S, D) and block_lse (B, N, S, 1); "
                         f"got {tuple(block_out.shape)} and {tuple(block_lse.shape)}")
    if (out is None) != (lse is None):
        raise ValueError(f"merge_partial takes out and lse both None (no block merged yet) or "
                         f"both tensors; got out={describe(out)} and lse={describe(lse)}")
    if out is not None and (out.shape != block_out.shape or lse.shape != block_lse.shape):
        raise ValueError(f"merge_partial: out {tuple(out.shape)} and lse {tuple(lse.shape)} must "
                         f"have the shapes of block_out {tuple(block_out.shape)} and block_lse "
                         f"{tuple(block_lse.shape)}")
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


def _checked(query, key, value, world, carried, input_layout, sparse_mode, pre_tokens,
             next_tokens, atten_mask, seq_lens, keywords):
    """This rank's own checks of a ring_attention call, and a plan of its first step (which
    validates the keywords as fused_attention does): (global band, sequence dim, shard
    length, seq_lens as ints, the fields the ranks must agree on, each step's keywords, the
    plan of the first step or None where the band misses it). Raises what fused_attention
    would."""
    check_tensors(query, key, value)
    if query.device.type not in carried:
        raise ValueError(f"query is on {query.device}, but the backend of group "
                         f"({', '.join(f'{d}:{b}' for d, b in carried.items())}) carries "
                         f"{', '.join(carried)} tensors only")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        raise NotImplementedError("ring_attention is forward only (no backward): run it under "
                                  "torch.no_grad() or torch.inference_mode()")
    if not isinstance(input_layout, str) or input_layout not in _SEQ_DIM:
        raise NotImplementedError(f"ring_attention takes input_layout BSH, BSND or BNSD, "
                                  f"got {input_layout!r}")
    refused = sorted(n for n in _REFUSED if n in keywords)
    if refused:
        raise NotImplementedError(f"ring_attention does not take {refused}: the LSE is always "
                                  f"returned and every shard is dense")
    band = _global_band(sparse_mode, pre_tokens, next_tokens, atten_mask, query.device)
    seq_dim = _SEQ_DIM[input_layout]
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != len(input_layout):
            raise ValueError(f"{name} must have {len(input_layout)} dims ({input_layout}), got "
                             f"shape {tuple(t.shape)}")
    local = query.shape[seq_dim]
    if key.shape[seq_dim] != local or value.shape[seq_dim] != local:
        raise ValueError(f"query, key and value shards must have the same length; got "
                         f"{query.shape[seq_dim]}, {key.shape[seq_dim]}, {value.shape[seq_dim]}")
    heads = int_arg(keywords.get("num_heads", 1), "num_heads", minimum=1)
    kv_heads = int_arg(keywords.get("num_key_value_heads", 0), "num_key_value_heads",
                       minimum=0) or heads
    if seq_lens is not None:
        seq_lens = [int_arg(n, f"seq_lens[{i}]", minimum=0) for i, n in enumerate(seq_lens)]
        if len(seq_lens) != world:
            raise ValueError(f"seq_lens must list the {world} ranks' shard lengths, got "
                             f"{seq_lens}")
    keywords = dict(keywords, input_layout=input_layout, softmax_lse_flag=True)
    diagonal = _step_band(band, 0, local, local, query.device)
    first_step = None
    if diagonal is not None:
        step_keywords, keys = diagonal
        first_step = plan(query, *(x.narrow(seq_dim, keys.start, keys.stop - keys.start)
                                   for x in (key, value)), **keywords, **step_keywords)
    fields = [_DTYPES.index(query.dtype), list(_SEQ_DIM).index(input_layout), heads, kv_heads,
              *_shape(query, seq_dim), *_shape(key, seq_dim), *_shape(value, seq_dim),
              int(sparse_mode), *(band or (_INT_MAX, _INT_MAX))]
    return band, seq_dim, local, seq_lens, fields, keywords, first_step


def _carried(group) -> dict[str, str]:
    """The backend of ``group`` for each device type it carries, as
    ``dist.get_backend_config`` lists them ("cpu:gloo,cuda:nccl")."""
    return dict(pair.split(":") for pair in dist.get_backend_config(group).split(","))


def _gather_device(carried, query, key, value, refusal) -> torch.device:
    """The device of the agreement's all_gather (module docstring, "Agreement"); raises
    ``refusal`` where a refusing rank has none."""
    for t in (query, key, value):
        if isinstance(t, torch.Tensor) and t.device.type in carried:
            return t.device
    if "cpu" in carried:
        return torch.device("cpu")
    if torch.accelerator.is_available():
        accelerator = torch.accelerator.current_accelerator()
        if accelerator.type in carried:
            return torch.device(accelerator.type, torch.accelerator.current_device_index())
    raise refusal


def _global_band(sparse_mode, pre_tokens, next_tokens, atten_mask, device):
    """(pre, next) of the global band, top-left coordinates; None for no band. The integers
    are checked as fused_attention checks them."""
    sparse_mode = int_arg(sparse_mode, "sparse_mode", minimum=0)
    pre = int_arg(pre_tokens, "pre_tokens", -INT64_MAX - 1, INT64_MAX, "torch_npu's int64")
    nxt = int_arg(next_tokens, "next_tokens", -INT64_MAX - 1, INT64_MAX, "torch_npu's int64")
    check_mask(atten_mask, device)
    if sparse_mode == 0:
        if atten_mask is not None:
            raise NotImplementedError("ring_attention takes no explicit atten_mask; use "
                                      "sparse_mode 2/3 (causal) or 4 (band)")
        if (pre, nxt) != (_INT_MAX, _INT_MAX):
            raise NotImplementedError("pre_tokens/next_tokens with sparse_mode=0 need a full "
                                      "mask; use sparse_mode=4 for a band")
        return None
    if sparse_mode not in (2, 3, 4):
        raise NotImplementedError(f"ring_attention takes sparse_mode 0, 2, 3 or 4, "
                                  f"got {sparse_mode}")
    if atten_mask is not None:
        check_optimized_mask(atten_mask, sparse_mode)
    if sparse_mode in (2, 3):
        return _INT_MAX, 0
    if pre + nxt < 0:
        raise ValueError(f"the band is empty: pre_tokens ({pre}) + next_tokens ({nxt}) < 0")
    return pre, nxt


#: the fields the ranks must agree on, and how many ints each takes
_FIELDS = {"dtype": 1, "input_layout": 1, "num_heads": 1, "num_key_value_heads": 1,
           "query's shape (the sequence length aside)": 3,
           "key's shape (the sequence length aside)": 3,
           "value's shape (the sequence length aside)": 3,
           "sparse_mode, pre_tokens, next_tokens (the global band)": 3}


def _agree(group, world, device, seq_lens, local, fields, refusal):
    """The ranks' shard lengths, once no rank refused its arguments and every rank's
    ``fields`` (the ints of ``_FIELDS``), ``seq_lens`` and shard length are known to agree;
    else an error on every rank: ``refusal`` (this rank's own error, or None) where this
    rank refused, else ValueError. One all_gather of a small int64 tensor."""
    given = [-1] * world if seq_lens is None or refusal is not None else seq_lens
    if refusal is not None:
        fields = [0] * sum(_FIELDS.values())
    mine = torch.tensor([int(refusal is not None)] + fields + given + [local],
                        dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    every = [t.tolist() for t in every]
    if refusal is not None:
        raise refusal
    refused = [r for r, theirs in enumerate(every) if theirs[0]]
    if refused:
        raise ValueError(f"ring_attention: rank{'s' * (len(refused) > 1)} "
                         f"{', '.join(map(str, refused))} of group refused "
                         f"{'its' if len(refused) == 1 else 'their'} arguments (the error is "
                         f"raised there); no K/V was sent")
    start = 1
    for name, width in [*_FIELDS.items(), ("seq_lens", world)]:
        stop = start + width
        for r, theirs in enumerate(every):
            if theirs[start:stop] != every[0][start:stop]:
                raise ValueError(f"ring_attention: the ranks of group disagree on {name}: rank 0 "
                                 f"has {_shown(name, every[0][start:stop])}, rank {r} has "
                                 f"{_shown(name, theirs[start:stop])}")
        start = stop
    lens = [theirs[-1] for theirs in every]
    if seq_lens is None and len(set(lens)) > 1:
        raise ValueError(f"seq_lens is None, which needs every rank's shard to have the same "
                         f"length; the shard lengths are {lens}: pass seq_lens={lens}")
    if seq_lens is not None and seq_lens != lens:
        raise ValueError(f"seq_lens {seq_lens} does not match the ranks' shard lengths {lens}")
    return lens


def _shown(name, values):
    """A field's values as a message shows them."""
    if name == "dtype":
        return _DTYPES[values[0]]
    if name == "input_layout":
        return repr(list(_SEQ_DIM)[values[0]])
    if name == "seq_lens" and values[0] < 0:
        return None
    if name.endswith("aside)"):
        return tuple(v for v in values if v >= 0)
    return values[0] if len(values) == 1 else values


def _shape(t, seq_dim):
    """``t``'s shape without the sequence dim, padded with -1 to 3 dims (BSH has 2)."""
    dims = [n for i, n in enumerate(t.shape) if i != seq_dim]
    return dims + [-1] * (3 - len(dims))


def _step_band(band, shift: int, s_q: int, s_kv: int, device):
    """One step's band, ``shift`` = the q shard's offset minus the kv shard's: None where the
    band misses the step (skipped), else (fused_attention's keywords, the slice of the kv
    shard attended). sparse_mode 0 where the band covers the step; a one-query step
    (fused_attention's decode, which takes no band) attends the band's keys only; else
    sparse_mode 4 with the band in the step's own coordinates."""
    every = slice(0, s_kv)
    if band is None:
        return {"sparse_mode": 0}, every
    pre, nxt = band
    lo, hi = shift - pre, shift + nxt  # key index - query index, local, within the band
    if hi < -(s_q - 1) or lo > s_kv - 1:
        return None
    if lo <= -(s_q - 1) and hi >= s_kv - 1:
        return {"sparse_mode": 0}, every
    if s_q == 1:
        return {"sparse_mode": 0}, slice(max(lo, 0), min(hi, s_kv - 1) + 1)
    limit = s_q + s_kv
    pre_tl, nxt_tl = min(-lo, limit), min(hi, limit)  # top-left; sparse_mode 4 counts from
    return {"sparse_mode": 4, "atten_mask": _mask(device),  # the bottom right
            "pre_tokens": pre_tl + s_kv - s_q, "next_tokens": nxt_tl - s_kv + s_q}, every


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
