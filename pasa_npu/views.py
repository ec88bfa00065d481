"""A call's tensors as the problem takes them (:class:`~pasa_npu.problem.AttentionProblem`):
(B, N, S, D) views of torch_npu's layouts and, with a block table, views of the paged caches
(num_blocks, N_kv, block_size, D) and the table itself. :func:`plan_views` checks the shapes
once per plan; :func:`call_inputs` takes each call's views and its table's entries."""
from __future__ import annotations

import torch

from .options import MAX_BATCH, MAX_HEAD_DIM, MAX_NBSD_QUERY_LEN, Options, check_sink
from .paged_kv import contiguous
from .paging import cache_views, check_arguments, table_for_call


def plan_views(call, options: Options):
    """(q, k, v) of ``call`` as the problem takes them, after checking their shapes against
    the head counts, each other and FIA's limits (batch, head dims, BNSD_NBSD's query
    length, ``inner_precise`` in decode), the block table's arguments, and the learnable
    sinks against the query heads and the value head dim."""
    layout, block_size = options.in_layout, options.block_size
    paged = call.block_table is not None or block_size != 0
    if not paged:
        q, k, v = canonical_views(call.query, call.key, call.value, layout, options.num_heads,
                                  options.num_kv_heads)
        check_shapes(q, k, v, layout)
    else:
        q = to_canonical(call.query, "query", layout, options.num_heads)
    _check_query_shape(q, call.input_layout, options)
    if paged:
        check_arguments(call.block_table, block_size, call.query.device)
        k, v = cache_views(call.key, call.value, layout, options.num_kv_heads, block_size)
        if k.shape[3] != q.shape[3]:
            raise ValueError(f"key head dim {k.shape[3]} differs from query head dim "
                             f"{q.shape[3]}")
    if v.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f"value's head dim must be at most {MAX_HEAD_DIM} (torch_npu's "
                         f"limit), got {v.shape[3]}")
    check_sink(call.learnable_sink, options.num_heads, call.input_layout, v.shape[3],
               call.query.device)
    return q, k, v


def call_inputs(call, layout: str, num_heads: int, num_kv_heads: int, block_size: int,
                kv_lens: torch.Tensor, kv_starts: torch.Tensor, packed: bool, gather: bool,
                table_on_host: bool, on_host: bool, device_lengths: bool = False):
    """(q, k, v, block_table, kv_starts) of one call of a plan: the views of
    :func:`plan_views`, unchecked (the plan checked tensors of these shapes), and with a
    block table its entries checked (:func:`~pasa_npu.paging.table_for_call`; the table on
    the host or not: ``table_on_host``; the query: ``on_host``; by the backend, on the device,
    where the lengths stay there: ``device_lengths``). ``gather``: the paged
    rows in use as one contiguous copy (:func:`~pasa_npu.paged_kv.contiguous`), the table
    None and ``kv_starts`` theirs."""
    if not block_size:  # tensors of the shapes the plan checked: views alone
        view = _CANONICAL[layout]
        return (view(call.query, num_heads), view(call.key, num_kv_heads),
                view(call.value, num_kv_heads), None, kv_starts)
    q = to_canonical(call.query, "query", layout, num_heads)
    k, v = cache_views(call.key, call.value, layout, num_kv_heads, block_size)
    table = table_for_call(call.block_table, kv_lens, k.shape[0], block_size, call.query.device,
                           table_on_host, on_host, device_lengths)
    if gather:
        k, v, kv_starts = contiguous(k, v, table, kv_lens, block_size, packed)
        table = None
    return q, k, v, table, kv_starts


def _check_query_shape(q: torch.Tensor, input_layout: str, options: Options) -> None:
    """FIA's refusals that depend on the query's shape: a batch over 65536 (padded layouts),
    a head dim over 512, BNSD_NBSD with a query longer than 16, ``inner_precise`` 2 or 3
    (row-invalid handling) in decode."""
    if not options.packed and q.shape[0] > MAX_BATCH:
        raise ValueError(f"the batch must be at most {MAX_BATCH} (torch_npu's limit), got "
                         f"{q.shape[0]}")
    if q.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f"query's head dim must be at most {MAX_HEAD_DIM} (torch_npu's "
                         f"limit), got {q.shape[3]}")
    if input_layout == "BNSD_NBSD" and q.shape[2] > MAX_NBSD_QUERY_LEN:
        raise ValueError(f"input_layout BNSD_NBSD takes a query length of at most "
                         f"{MAX_NBSD_QUERY_LEN} (torch_npu's limit), got {q.shape[2]}")
    if not options.packed and q.shape[2] == 1 and options.inner_precise > 1:
        raise ValueError(f"inner_precise must be 0 or 1 in decode (query length 1), as "
                         f"torch_npu requires; got {options.inner_precise}")


def to_canonical(t: torch.Tensor, name: str, layout: str, heads: int) -> torch.Tensor:
    """A (B, N, S, D) view of ``t`` given in ``layout`` (packed: B = 1, S = T)."""
    dims = 3 if layout in ("BSH", "TND", "NTD") else 4
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D for input_layout {layout}, got shape "
                         f"{tuple(t.shape)}")
    if layout == "BSH":
        if t.shape[2] % heads:
            raise ValueError(f"{name}'s hidden size {t.shape[2]} is not divisible by its head "
                             f"count {heads} (input_layout BSH)")
        return _CANONICAL[layout](t, heads)
    head_axis = {"BSND": 2, "BNSD": 1, "TND": 1, "NTD": 0}[layout]
    if t.shape[head_axis] != heads:
        what = "num_heads" if name == "query" else "num_key_value_heads (or num_heads)"
        raise ValueError(f"{name} has {t.shape[head_axis]} heads on its N axis (input_layout "
                         f"{layout}) but {what} is {heads}")
    return _CANONICAL[layout](t, heads)


#: layout -> the (B, N, S, D) view of a tensor in it, given its head count, unchecked
_CANONICAL = {
    "BSH": lambda t, heads: t.view(t.shape[0], t.shape[1], heads,
                                   t.shape[2] // heads).permute(0, 2, 1, 3),
    "BSND": lambda t, heads: t.permute(0, 2, 1, 3),
    "BNSD": lambda t, heads: t,
    "TND": lambda t, heads: t.permute(1, 0, 2).unsqueeze(0),
    "NTD": lambda t, heads: t.unsqueeze(0),
}


def unchecked_view(layout: str):
    """The function ``(t, heads) -> (B, N, S, D) view of t`` of ``layout``, which checks
    nothing: for tensors of the shapes a plan checked."""
    return _CANONICAL[layout]


def canonical_views(query, key, value, layout: str, num_heads: int, num_kv_heads: int):
    """(q, k, v) as (B, N, S, D) views, each checked against its head count."""
    return (to_canonical(query, "query", layout, num_heads),
            to_canonical(key, "key", layout, num_kv_heads),
            to_canonical(value, "value", layout, num_kv_heads))


def check_shapes(q, k, v, layout) -> None:
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"key batch {k.shape[0]} differs from query batch {q.shape[0]} "
                         f"(input_layout {layout})")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"key head dim {k.shape[3]} differs from query head dim {q.shape[3]}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"value (batch, heads, seq) {tuple(v.shape[:3])} differs from key's "
                         f"{tuple(k.shape[:3])} (canonical BNSD order)")
