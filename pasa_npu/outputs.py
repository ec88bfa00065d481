"""The outputs as torch_npu returns them: allocated in the output layout, and its row rules
applied after the backend (rows past a query length, rows that see no key)."""
from __future__ import annotations

import torch

from .paged_kv import to_device
from .problem import LSE_MASKED_ROW, AttentionProblem
from .tensor_memo import TensorMemo


def allocate_output(q, v, out_layout, dtype, zero: bool):
    """The output tensor in ``out_layout`` and its canonical (Bt, N, S, Dv) view."""
    bt, n, s, _ = q.shape
    d_v = v.shape[3]
    kw = dict(dtype=dtype, device=q.device)
    new = torch.zeros if zero else torch.empty
    if out_layout == "BSH":
        out = new(bt, s, n * d_v, **kw)
        return out, out.view(bt, s, n, d_v).permute(0, 2, 1, 3)
    if out_layout == "BSND":
        out = new(bt, s, n, d_v, **kw)
        return out, out.permute(0, 2, 1, 3)
    if out_layout == "BNSD":
        out = new(bt, n, s, d_v, **kw)
        return out, out
    if out_layout == "NBSD":
        out = new(n, bt, s, d_v, **kw)
        return out, out.permute(1, 0, 2, 3)
    if out_layout == "TND":
        out = new(s, n, d_v, **kw)
        return out, out.permute(1, 0, 2).unsqueeze(0)
    out = new(n, s, d_v, **kw)  # NTD
    return out, out.unsqueeze(0)


def allocate_lse(q, packed: bool, dtype):
    bt, n, s, _ = q.shape
    if packed:
        lse = torch.zeros(s, n, 1, dtype=dtype, device=q.device)
        return lse, lse[..., 0].permute(1, 0).unsqueeze(0)
    lse = torch.zeros(bt, n, s, 1, dtype=dtype, device=q.device)
    return lse, lse[..., 0]


def lse_placeholder(device) -> torch.Tensor:
    """The LSE returned when ``softmax_lse_flag`` is False: an empty float32 tensor of shape
    (0,), as op-plugin's FIA adapter and meta function return from 7.2.0 on (the release
    line torch_npu 2.13.0 is built from); docs/fia-conformance.md, "softmax_lse"."""
    return torch.empty(0, dtype=torch.float32, device=device)


def shared_lse_placeholder(device) -> torch.Tensor:
    """:func:`lse_placeholder`, one tensor per device returned by every eager call that
    repeats a recorded plan (it holds no element for a caller to change; one resized
    in place is replaced)."""
    t = _PLACEHOLDERS.get(device)
    if t is None or t.numel() or t.requires_grad:
        t = _PLACEHOLDERS[device] = lse_placeholder(device)
    return t


_PLACEHOLDERS: dict = {}


def fix_rows(problem: AttentionProblem, value: torch.Tensor, plan) -> None:
    """torch_npu's row rules (docs/fia-conformance.md, "Rows with nothing to attend").
    Rows past the query length: 0, LSE 0. Rows that see no key get row-invalid handling,
    output 0 and LSE +inf, when inner_precise bit 1 is set or when the band or the lengths
    alone leave them empty (FIA switches it on itself there). Rows that only the explicit
    mask empties, without bit 1: the mean of V over the valid keys, LSE float32's lowest."""
    if problem.device_lengths is not None:
        return  # the backend applied them (problem.DeviceLengths)
    if problem.lse is not None and plan.lse_rows_past:
        past = torch.arange(problem.lse.shape[2]) >= problem.q_lens[:, None]
        problem.lse.masked_fill_(to_device(past[:, None], problem.lse.device), 0.0)
    if not plan.may_have_empty:
        return
    if problem.mask is not None:
        _fix_masked_rows(problem, value, plan.options.inner_precise, plan.mask_source)
        return
    # the band and the lengths alone: every row's fate is known on the host
    empty = _valid_rows_and_by_band(problem)[1]
    if bool(empty.any()):
        _set_rows(problem, empty, 0.0, float("inf"))


def _fix_masked_rows(problem: AttentionProblem, value: torch.Tensor, inner_precise: int,
                     source: torch.Tensor) -> None:
    """:func:`fix_rows` where an explicit mask (the caller's ``source``) may empty rows (never
    packed). Which rows it empties is read back once per version of the mask's contents and
    of the lengths (:func:`_rows_seeing_keys`); a call whose mask empties none does nothing
    more."""
    valid, by_band = _valid_rows_and_by_band(problem)
    empty = valid & ~_rows_seeing_keys(problem, source)
    if not bool(empty.any()):
        return
    invalid = empty if inner_precise & 2 else empty & by_band
    _set_rows(problem, invalid, 0.0, float("inf"))
    masked = empty & ~invalid
    if not bool(masked.any()):
        return
    b_idx, rows = masked.nonzero(as_tuple=True)
    means = torch.zeros(problem.batch, value.shape[1], value.shape[3], dtype=torch.float64,
                        device=value.device)
    for b in set(b_idx.tolist()):
        if int(problem.kv_lens[b]):
            means[b] = problem.kv_rows(value, b).double().mean(1)
    means = means.repeat_interleave(problem.group, dim=1)  # kv heads -> query heads
    tb, pos = _positions(problem, b_idx, rows)
    dev = problem.out.device
    problem.out[to_device(tb, dev), :, to_device(pos, dev)] = means[to_device(b_idx, means.device)].to(
        problem.out.dtype).to(dev)
    _set_rows(problem, masked, None, LSE_MASKED_ROW)


_ROWS_SEEING_KEYS = TensorMemo()  # by the caller's mask, its lengths and band


def _rows_seeing_keys(problem: AttentionProblem, source: torch.Tensor) -> torch.Tensor:
    """Bool (B, S1) on the host: the rows that see a key, the explicit mask included. Read
    back from the mask's device once per version of the caller's mask ``source`` (of the
    tensor it views: a fresh view of it each call reads nothing again) and per lengths and
    band (:class:`~pasa_npu.tensor_memo.TensorMemo`)."""
    band = None if problem.band is None else tuple(tuple(t.tolist()) for t in problem.band)
    facts = (tuple(problem.q_lens.tolist()), tuple(problem.kv_lens.tolist()), band,
             problem.kv_extent, problem.query.shape[2])
    has = _ROWS_SEEING_KEYS.get(source, facts)
    if has is None:
        has = _rows_with_keys(problem).cpu()
        _ROWS_SEEING_KEYS.put(source, has, facts)
    return has


def _positions(problem: AttentionProblem, b_idx: torch.Tensor, rows: torch.Tensor):
    """(batch index into the output, row index into its S axis) of per-batch local rows."""
    tb = torch.zeros_like(b_idx) if problem.packed else b_idx
    return tb, rows + problem.q_starts[b_idx]


def _set_rows(problem: AttentionProblem, which: torch.Tensor, out_value, lse_value) -> None:
    """Write ``out_value`` (None: leave) into every head of the output rows ``which`` (bool
    (B, S1), local rows) and ``lse_value`` into their LSE."""
    if not bool(which.any()):
        return
    b_idx, rows = which.nonzero(as_tuple=True)
    tb, pos = _positions(problem, b_idx, rows)
    # the value as a device tensor: a Python scalar would be copied from pageable host memory
    for t, value in ((problem.out, out_value), (problem.lse, lse_value)):
        if t is not None and value is not None:
            dev = t.device
            t[to_device(tb, dev), :, to_device(pos, dev)] = torch.full((), value, dtype=t.dtype, device=dev)


def _valid_rows_and_by_band(problem: AttentionProblem) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool (B, max S1) on the host, twice, from the lengths and the band: the rows inside
    the query length, and those of them that the band and the lengths alone leave without
    a key (FIA's operator knows these from its arguments and handles them as invalid rows
    itself)."""
    s_q = problem.query.shape[2] if not problem.packed else problem.max_q_len
    i = torch.arange(s_q)[None, :]
    valid = i < problem.q_lens[:, None]
    lo = torch.zeros_like(i)
    hi = problem.kv_lens[:, None] - 1
    if problem.band is not None:
        pre, nxt = problem.band
        lo = torch.maximum(lo, i - pre[:, None])
        hi = torch.minimum(hi, i + nxt[:, None])
    return valid, valid & (lo > hi)


def _rows_with_keys(problem: AttentionProblem) -> torch.Tensor:
    """Bool (B, S1) on the mask's device: the rows that see a key, the explicit mask
    included."""
    s_q = problem.query.shape[2]
    device = problem.mask.device
    cols = torch.arange(problem.kv_extent, device=device)
    has = torch.zeros(problem.batch, s_q, dtype=torch.bool, device=device)
    chunk = max(1, (1 << 22) // max(1, cols.numel()))
    for r0 in range(0, s_q, chunk):
        rows = torch.arange(r0, min(r0 + chunk, s_q), device=device)
        has[:, r0:r0 + rows.numel()] = problem.visible(rows, cols).any(-1)
    return has
