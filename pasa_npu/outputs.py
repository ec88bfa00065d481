"""The outputs as torch_npu returns them: allocated in the output layout, and its row rules
applied after the backend (rows past a query length, rows that see no key)."""
from __future__ import annotations

import torch

from .problem import AttentionProblem


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
    return torch.zeros(1, dtype=torch.float32, device=device)


def fix_rows(problem: AttentionProblem, value: torch.Tensor, plan) -> None:
    """torch_npu's row rules: rows past the query length are 0 (LSE too); rows that
    see no key are 0 with inner_precise bit 1, else the mean of V over valid keys."""
    if problem.lse is not None and plan.lse_rows_past:
        past = torch.arange(problem.lse.shape[2]) >= problem.q_lens[:, None]
        problem.lse.masked_fill_(past[:, None].to(problem.lse.device), 0.0)
    if plan.inner_precise & 2 or not plan.may_have_empty:
        return
    empty = _rows_without_keys(problem)
    if not bool(empty.any()):
        return
    b_idx, rows = empty.nonzero(as_tuple=True)
    means = torch.zeros(problem.batch, value.shape[1], value.shape[3], dtype=torch.float64,
                        device=value.device)
    for b in set(b_idx.tolist()):
        s, n = int(problem.kv_starts[b]), int(problem.kv_lens[b])
        if n:
            tb = 0 if problem.packed else b
            means[b] = value[tb, :, s:s + n].double().mean(1)
    means = means.repeat_interleave(problem.group, dim=1)  # kv heads -> query heads
    tb = torch.zeros_like(b_idx) if problem.packed else b_idx
    pos = rows + problem.q_starts[b_idx]
    dev = problem.out.device
    problem.out[tb.to(dev), :, pos.to(dev)] = means[b_idx.to(means.device)].to(
        problem.out.dtype).to(dev)


def may_have_empty_rows(q_lens: list, kv_lens: list, band) -> bool:
    """Can a row inside its query length see no key (band and lengths only)? O(B) in
    Python ints: a few per batch, cheaper than tensor operations on a decode step. Row i
    sees [max(0, i - pre), min(kv_len - 1, i + next)]."""
    pres, nxts = (t.tolist() for t in band) if band is not None else ((), ())
    for b, (q, kv) in enumerate(zip(q_lens, kv_lens)):
        if q > 0 and (kv == 0 or (band is not None and (nxts[b] < 0 or q - 1 - pres[b] > kv - 1))):
            return True
    return False


def _rows_without_keys(problem: AttentionProblem) -> torch.Tensor:
    """Bool (B, max S1) on CPU: rows inside the query length that can see no key."""
    s_q = problem.query.shape[2] if not problem.packed else problem.max_q_len
    i = torch.arange(s_q)[None, :]
    valid = i < problem.q_lens[:, None]
    if problem.mask is None:
        lo = torch.zeros_like(i)
        hi = problem.kv_lens[:, None] - 1
        if problem.band is not None:
            pre, nxt = problem.band
            lo = torch.maximum(lo, i - pre[:, None])
            hi = torch.minimum(hi, i + nxt[:, None])
        return valid & (lo > hi)
    cols = torch.arange(problem.key.shape[2], device=problem.mask.device)
    has = torch.zeros(problem.batch, s_q, dtype=torch.bool)
    chunk = max(1, (1 << 22) // max(1, cols.numel()))
    for r0 in range(0, s_q, chunk):
        rows = torch.arange(r0, min(r0 + chunk, s_q), device=problem.mask.device)
        has[:, r0:r0 + rows.numel()] = problem.visible(rows, cols).any(-1).cpu()
    return valid & ~has
