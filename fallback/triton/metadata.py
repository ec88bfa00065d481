"""The Triton kernels' per-batch metadata on the device: lengths and band limits as int32
rows of one tensor, copied once per distinct set of values (:func:`device_metadata`), and
the host ints they come from (:func:`host_ints`); or, for lengths the call gave on the
device (:class:`~pasa_npu.problem.DeviceLengths`), made there by a kernel
(:func:`device_length_rows`), with the row rules they imply applied after the attention
kernels (:func:`apply_row_rules`)."""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pasa_npu.fallback.kernel_common import (Binding, cdiv, interpreting, mask_argument,
                                             placeholder)
from pasa_npu.problem import (BAND_LIMIT, LSE_MASKED_ROW, AttentionProblem,
                              keeps_device_tensors)

_HOST_INTS: dict = {}
_DEVICE_METADATA: dict = {}
_CAPTURED_METADATA: dict = {}  # read by captured CUDA graphs: never freed
_CAPTURED_SOURCES: dict = {}  # pinned sources of the copies captured in calls that keep nothing


def host_ints(values: torch.Tensor) -> tuple[int, ...]:
    """Small per-batch metadata (lengths, band limits) as Python ints, cached by identity:
    the API layer reuses its length tensors across calls with the same arguments and never
    writes them."""
    hit = _HOST_INTS.get(id(values))
    if hit is not None and hit[0] is values:
        return hit[1]
    if len(_HOST_INTS) > 512:
        _HOST_INTS.clear()
    ints = tuple(values.tolist())
    _HOST_INTS[id(values)] = (values, ints)
    return ints


def device_metadata(problem: AttentionProblem, device: torch.device) -> tuple:
    """(q_starts, q_lens, kv_starts, kv_lens, band_pre, band_next) as int32 rows of one
    tensor on ``device`` (the band rows repeat q_lens when there is no band; band limits
    are clamped to +-BAND_LIMIT).

    Cached by value: a repeated call copies nothing. New values (a decode step whose
    lengths grew) are copied from pinned memory without blocking, so the host never waits
    for the work queued on the stream, as a pageable copy would make it. Another stream
    that reuses the copy waits for it on the GPU. While a CUDA graph is being captured the
    copy is captured; an entry a graph reads, and the pinned source of a captured copy, are
    kept for good. A call that keeps nothing (:func:`~pasa_npu.problem.keeping_nothing`)
    gets a copy of its own, from a pinned source kept for good where it is captured."""
    rows = [host_ints(t) for t in (problem.q_starts, problem.q_lens, problem.kv_starts,
                                    problem.kv_lens)]
    if problem.band is not None:
        rows += [tuple(max(-BAND_LIMIT, min(BAND_LIMIT, x)) for x in host_ints(t))
                 for t in problem.band]
    else:
        rows += [rows[1], rows[1]]
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, tuple(rows))
    capturing = cuda and torch.cuda.is_current_stream_capturing()
    # the raw handle Triton launches on: a cheap query, unlike torch.cuda.current_stream
    stream = torch._C._cuda_getCurrentRawStream(device.index) if cuda else None
    if not keeps_device_tensors():
        source = _CAPTURED_SOURCES.get(key)
        if source is None:
            _check_int32(rows)
            source = torch.tensor(rows, dtype=torch.int32, pin_memory=cuda)
            if capturing:
                _CAPTURED_SOURCES[key] = source
        return source.to(device, non_blocking=True).unbind(0)
    entry = _DEVICE_METADATA.get(key) or _CAPTURED_METADATA.get(key)
    if entry is None:
        _check_int32(rows)
        if len(_DEVICE_METADATA) > 512:
            _DEVICE_METADATA.clear()
        host = torch.tensor(rows, dtype=torch.int32, pin_memory=cuda)
        copy = host.to(device, non_blocking=True)
        copied = None
        if cuda and not capturing:
            copied = torch.cuda.Event()
            copied.record()
        entry = _DEVICE_METADATA[key] = _Metadata(copy.unbind(0), copy, stream, copied,
                                                  host if capturing else None)
    elif cuda and stream != entry.stream and not capturing:
        # (a capture starts after a device synchronisation: the copy is complete then)
        current = torch.cuda.current_stream(device)
        if entry.copied is not None:
            current.wait_event(entry.copied)
        entry.tensor.record_stream(current)  # not reused while this stream may read it
    if capturing:
        _CAPTURED_METADATA[key] = entry
    return entry.rows


def _check_int32(rows: list) -> None:
    if max((max(row, default=0) for row in rows[:4]), default=0) > BAND_LIMIT:  # all >= 0
        raise NotImplementedError(f"the Triton backend indexes in int32; got lengths "
                                  f"{[list(r) for r in rows[:4]]}")


class _Metadata(NamedTuple):
    rows: tuple            # the six int32 rows: views of ``tensor``
    tensor: torch.Tensor   # on the device
    stream: object         # the raw handle of the stream the copy was issued on
    copied: object         # an event after the copy (None where there is no CUDA stream)
    pinned_source: object  # the host tensor a captured copy reads on every replay


#: batches per program of the lengths kernel
_LENGTHS_BLOCK = 128
#: rows (and keys) per program (and step) of the row rules kernel
_RULES_BLOCK = 64
_LSE_MASKED_ROW = tl.constexpr(LSE_MASKED_ROW)
#: the band tokens as the lengths kernel takes them: beyond any length, within int64
_TOKEN_LIMIT = 1 << 40


def device_length_rows(problem: AttentionProblem, device: torch.device,
                       binding: Binding) -> tuple:
    """(q_starts, q_lens, kv_starts, kv_lens, band_pre, band_next, refused): the rows of
    :func:`device_metadata` and each batch's refusal (int32, 1: refused), made on
    ``device`` from ``problem.device_lengths`` by one launch, through ``binding``
    (:class:`~pasa_npu.problem.DeviceLengths` says what they are)."""
    given = problem.device_lengths
    batch = problem.batch
    rows = binding.empty("length_rows", (7, batch), torch.int32, device)
    absent = placeholder(device, torch.int32)
    q_given = given.q_lens if given.q_lens is not None else absent
    kv_given = given.kv_lens if given.kv_lens is not None else absent
    table = problem.block_table if problem.paged else absent
    mode, pre, nxt = given.band_rule or (-1, 0, 0)
    binding.launch(
        _lengths_kernel, (cdiv(batch, _LENGTHS_BLOCK),), q_given, kv_given, table, rows,
        batch, _step(given.q_lens), _step(given.kv_lens), table.stride(0) if problem.paged else 0,
        table.shape[1] if problem.paged else 0, problem.key.shape[0], problem.block_size,
        problem.query.shape[2], problem.kv_extent,
        max(-_TOKEN_LIMIT, min(_TOKEN_LIMIT, pre)), max(-_TOKEN_LIMIT, min(_TOKEN_LIMIT, nxt)),
        HAS_Q=given.q_lens is not None, HAS_KV=given.kv_lens is not None, PAGED=problem.paged,
        PACKED_Q=problem.packed, PACKED_KV=problem.packed and not problem.paged,
        SPARSE_MODE=mode, BAND_LIMIT=BAND_LIMIT, BLOCK=_LENGTHS_BLOCK,
        num_warps=1 if interpreting() else 4)
    return tuple(binding.derive(f"length_row_{i}", rows, functools.partial(_row, i),
                                reads_contents=False) for i in range(7))


def _row(i: int, rows: torch.Tensor) -> torch.Tensor:
    return rows[i]


def _step(given) -> int:
    """A given length tensor's step between batches: 0 for one entry for every batch."""
    return 0 if given is None or given.numel() == 1 else given.stride(0)


@triton.jit
def _lengths_kernel(Q_GIVEN, KV_GIVEN, TABLE, ROWS, batch, step_q, step_kv, stride_tb, n_entries,
                    num_blocks, block_size, q_capacity, kv_capacity, pre, nxt,
                    HAS_Q: tl.constexpr, HAS_KV: tl.constexpr, PAGED: tl.constexpr,
                    PACKED_Q: tl.constexpr, PACKED_KV: tl.constexpr, SPARSE_MODE: tl.constexpr,
                    BAND_LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    """ROWS (7, batch): :func:`device_length_rows` for BLOCK batches; PACKED_Q, PACKED_KV: the
    given lengths are cumulative (:func:`_sequence`). The band is that of
    ``pasa_npu.masks.band_of_lengths`` (SPARSE_MODE 0, 2-4; -1: no band, its rows q_lens),
    and modes 0 and 4 refuse the lengths ``pasa_npu.masks.token_lengths_refused`` does."""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = b < batch
    zero = tl.zeros([BLOCK], tl.int64)
    refused = zero != 0
    q_start = zero
    q_len = zero + q_capacity
    if HAS_Q:
        q_start, q_len, wrong = _sequence(Q_GIVEN, b, live, step_q, q_capacity, PACKED_Q)
        refused = refused | wrong
    kv_limit = zero + kv_capacity
    if PAGED:  # the keys the row's leading entries in [0, num_blocks) hold
        leading = live
        held = zero
        for j in range(0, n_entries):
            entry = tl.load(TABLE + b.to(tl.int64) * stride_tb + j, mask=leading, other=-1)
            leading = leading & (entry >= 0) & (entry < num_blocks)
            held += leading.to(tl.int64)
        kv_limit = tl.minimum(held * block_size, kv_limit)
    kv_start = zero
    kv_len = kv_limit
    if HAS_KV:
        kv_start, kv_len, wrong = _sequence(KV_GIVEN, b, live, step_kv, kv_limit, PACKED_KV)
        refused = refused | wrong
    band_pre = q_len
    band_next = q_len
    if SPARSE_MODE == 0:
        band_pre = zero + pre
        band_next = zero + nxt
        refused = refused | ((nxt < 0) & (-nxt >= q_len)) | ((pre < 0) & (-pre >= kv_len))
    if SPARSE_MODE == 2:
        band_pre = zero + BAND_LIMIT
        band_next = zero
    if SPARSE_MODE == 3:
        band_pre = zero + BAND_LIMIT
        band_next = kv_len - q_len
    if SPARSE_MODE == 4:
        band_pre = pre - kv_len + q_len
        band_next = nxt + kv_len - q_len
        refused = refused | ((nxt < 0) & (-nxt >= kv_len)) | ((pre < 0) & (-pre >= q_len))
    band_pre = tl.minimum(tl.maximum(band_pre, -BAND_LIMIT), BAND_LIMIT)
    band_next = tl.minimum(tl.maximum(band_next, -BAND_LIMIT), BAND_LIMIT)
    tl.store(ROWS + b, q_start.to(tl.int32), mask=live)
    tl.store(ROWS + batch + b, q_len.to(tl.int32), mask=live)
    tl.store(ROWS + 2 * batch + b, kv_start.to(tl.int32), mask=live)
    tl.store(ROWS + 3 * batch + b, kv_len.to(tl.int32), mask=live)
    tl.store(ROWS + 4 * batch + b, band_pre.to(tl.int32), mask=live)
    tl.store(ROWS + 5 * batch + b, band_next.to(tl.int32), mask=live)
    tl.store(ROWS + 6 * batch + b, refused.to(tl.int32), mask=live)


@triton.jit
def _sequence(GIVEN, b, live, step, limit, CUMULATIVE: tl.constexpr):
    """(start, length, refused) of batches ``b`` from their given lengths: per batch, or
    CUMULATIVE ends (a sequence starts where the one before it ends); a length clamped into
    [0, limit] from its start (0 where per batch), refused where it lay outside."""
    given = tl.load(GIVEN + b * step, mask=live, other=0).to(tl.int64)
    if CUMULATIVE:
        start = tl.load(GIVEN + (b - 1) * step, mask=live & (b > 0), other=0).to(tl.int64)
        refused = (start < 0) | (given < start) | (given > limit)
        start = tl.minimum(tl.maximum(start, 0), limit)
        return start, tl.minimum(tl.maximum(given, start), limit) - start, refused
    return given * 0, tl.minimum(tl.maximum(given, 0), limit), (given < 0) | (given > limit)


def apply_row_rules(problem: AttentionProblem, lengths: tuple, binding: Binding) -> None:
    """The row rules of :class:`~pasa_npu.problem.DeviceLengths` on every row of the
    problem's outputs (and row flags), after the attention kernels, by one launch through
    ``binding``; ``lengths``: the rows of :func:`device_length_rows`."""
    out, lse = problem.out, problem.lse
    _, heads, s_q, head_dim = out.shape
    batch = problem.batch
    lse_arg = lse if lse is not None else placeholder(out.device, torch.float32)
    flags = (problem.overflow.row_flags if problem.overflow is not None
             else placeholder(out.device, torch.uint8))
    q_starts, q_lens, _, kv_lens, band_pre, band_next, refused = lengths
    mask, mask_strides = mask_argument(problem.mask, out.device)
    value = problem.value
    binding.launch(
        _row_rules_kernel, (batch * heads, cdiv(s_q, _RULES_BLOCK)), q_starts, q_lens, kv_lens,
        band_pre, band_next, refused, out, lse_arg, flags, mask, value, heads, s_q,
        *_batch_strides(out, problem.packed), *_batch_strides(lse, problem.packed, 3),
        *_batch_strides(problem.overflow and problem.overflow.row_flags, problem.packed, 3),
        *mask_strides, *value.stride(), problem.group, head_dim,
        HAS_LSE=lse is not None, HAS_FLAGS=problem.overflow is not None,
        HAS_BAND=problem.band is not None, HAS_MASK=problem.mask is not None,
        ROW_INVALID=problem.device_lengths.row_invalid, PACKED=problem.packed,
        BLOCK_R=_RULES_BLOCK, BLOCK_K=_RULES_BLOCK,
        HEAD_DIM=max(16, triton.next_power_of_2(head_dim)), num_warps=1 if interpreting() else 4)


def _batch_strides(t, packed: bool, dims: int = 4) -> tuple:
    """``t``'s strides as a per-batch kernel steps them: none for the one batch entry of a
    packed layout; zeros where there is no ``t``."""
    if t is None:
        return (0,) * dims
    return (0 if packed else t.stride(0), *t.stride()[1:])


@triton.jit
def _row_rules_kernel(Q_STARTS, Q_LENS, KV_LENS, BAND_PRE, BAND_NEXT, REFUSED, O, LSE, FLAGS,
                      MASK, V, n_heads, s_q, stride_ob, stride_oh, stride_os, stride_od,
                      stride_lb, stride_lh, stride_ls, stride_fb, stride_fh, stride_fs,
                      stride_xb, stride_xs, stride_xk, stride_vb, stride_vh, stride_vs,
                      stride_vd, group, head_dim, HAS_LSE: tl.constexpr,
                      HAS_FLAGS: tl.constexpr, HAS_BAND: tl.constexpr, HAS_MASK: tl.constexpr,
                      ROW_INVALID: tl.constexpr, PACKED: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr):
    """:func:`apply_row_rules` for BLOCK_R rows of one (batch, head): a row past the query
    length gets output 0, LSE 0 and flag 0 (padded layouts; packed, those rows are other
    sequences', or none's, left zero-filled); a row the band and the lengths leave without a
    key output 0 and LSE +inf; a row only the explicit MASK (padded, unpaged) leaves
    without one the same where ROW_INVALID, else the mean of V over the batch's keys (in
    fp64, as the API layer takes it) and LSE float32's lowest; every row of a refused
    batch NaN in both."""
    b = tl.program_id(0) // n_heads
    h = tl.program_id(0) % n_heads
    q_len = tl.load(Q_LENS + b)
    kv_len = tl.load(KV_LENS + b)
    refused = tl.load(REFUSED + b) != 0
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    lo = tl.zeros([BLOCK_R], tl.int32)
    hi = lo + kv_len - 1
    if HAS_BAND:
        lo = tl.maximum(rows - tl.load(BAND_PRE + b), 0)
        hi = tl.minimum(hi, rows + tl.load(BAND_NEXT + b))
    in_seq = rows < q_len
    empty = (lo > hi) & in_seq
    by_mask = rows < 0  # none
    if HAS_MASK:  # rows the band and lengths give keys, but the mask none of them
        seen = by_mask
        for n0 in range(0, kv_len, BLOCK_K):
            n = n0 + tl.arange(0, BLOCK_K)
            vis = in_seq[:, None] & (n[None, :] >= lo[:, None]) & (n[None, :] <= hi[:, None])
            masked = tl.load(MASK + b.to(tl.int64) * stride_xb + rows[:, None].to(tl.int64)
                             * stride_xs + n[None, :] * stride_xk, mask=vis, other=1)
            seen = seen | (tl.max((vis & (masked == 0)).to(tl.int32), 1) > 0)
        by_mask = in_seq & ~empty & ~seen
        if ROW_INVALID:
            empty = empty | by_mask
            by_mask = rows < 0
    if PACKED:
        past = rows < 0  # none
        fixed = (empty | refused) & in_seq
    else:
        past = ~in_seq & (rows < s_q)
        fixed = (past | empty | refused) & (rows < s_q)
    if HAS_MASK and not ROW_INVALID:
        if tl.max((by_mask & ~refused).to(tl.int32), 0) > 0:
            _mean_value_rows(O, LSE, V, b, h, rows, by_mask & ~refused, kv_len, group,
                             stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh,
                             stride_ls, stride_vb, stride_vh, stride_vs, stride_vd, head_dim,
                             HAS_LSE, BLOCK_K, HEAD_DIM)
    if tl.max(fixed.to(tl.int32), 0) == 0:
        return
    at = rows.to(tl.int64) + tl.load(Q_STARTS + b)
    dims = tl.arange(0, HEAD_DIM)
    o_ptrs = (O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + at[:, None] * stride_os + dims[None, :] * stride_od)
    out_value = tl.where(refused, float("nan"), 0.0)
    tl.store(o_ptrs, (tl.zeros([BLOCK_R, HEAD_DIM], tl.float32) + out_value).to(O.dtype.element_ty),
             mask=fixed[:, None] & (dims[None, :] < head_dim))
    if HAS_LSE:
        lse_value = tl.where(refused, float("nan"), tl.where(past, 0.0, float("inf")))
        tl.store(LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
                 + at * stride_ls, lse_value, mask=fixed)
    if HAS_FLAGS:
        tl.store(FLAGS + b.to(tl.int64) * stride_fb + h.to(tl.int64) * stride_fh
                 + at * stride_fs, tl.zeros([BLOCK_R], tl.uint8), mask=past)


@triton.jit
def _mean_value_rows(O, LSE, V, b, h, rows, which, kv_len, group, stride_ob, stride_oh,
                     stride_os, stride_od, stride_lb, stride_lh, stride_ls, stride_vb,
                     stride_vh, stride_vs, stride_vd, head_dim, HAS_LSE: tl.constexpr,
                     BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows ``which`` of head ``h``: output the mean of V over the batch's ``kv_len`` keys
    (fp64 sum, rounded once to the output's dtype; 0 without keys), LSE float32's lowest."""
    dims = tl.arange(0, HEAD_DIM)
    v_base = V + b.to(tl.int64) * stride_vb + (h // group).to(tl.int64) * stride_vh
    total = tl.zeros([HEAD_DIM], tl.float64)
    for n0 in range(0, kv_len, BLOCK_K):
        n = n0 + tl.arange(0, BLOCK_K)
        v = tl.load(v_base + n[:, None].to(tl.int64) * stride_vs + dims[None, :] * stride_vd,
                    mask=(n[:, None] < kv_len) & (dims[None, :] < head_dim), other=0.0)
        total += tl.sum(v.to(tl.float64), 0)
    mean = total / tl.maximum(kv_len, 1).to(tl.float64)
    o_ptrs = (O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + rows[:, None].to(tl.int64) * stride_os + dims[None, :] * stride_od)
    tl.store(o_ptrs, (tl.zeros([rows.shape[0], HEAD_DIM], tl.float64) + mean[None, :])
             .to(O.dtype.element_ty), mask=which[:, None] & (dims[None, :] < head_dim))
    if HAS_LSE:
        tl.store(LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
                 + rows.to(tl.int64) * stride_ls,
                 tl.zeros([rows.shape[0]], tl.float32) + _LSE_MASKED_ROW, mask=which)
