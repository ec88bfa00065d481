"""Blockwise PyTorch implementation of every precision allocation (the ``torch`` backend).

A faithful step-by-step emulation of what the kernels do (docs/design.md, "The
algorithm"): the
keys are preprocessed once per kv block, then each query block walks the kv
blocks with online softmax. Low-precision steps are emulated by computing in
fp32 and rounding to the compute dtype exactly where the allocation says (see
:mod:`pasa_npu.numerics`). Vectorised over batch and heads; GQA reads each kv
head once for its whole query group (no K/V copies per query head).

A row that sees no key of a block leaves its state untouched, so which tiles a
kernel skips never changes the numbers, and PASA's pseudo-average counts only
the blocks the row actually used. Learnable sinks join at the end of the row
(:func:`_finish`).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Iterator

import torch

from pasa_npu import numerics
from pasa_npu.beta import (ideal_invariance, partial_block_correction, partial_block_shift,
                           shift_matrix, shift_matrix_entries)
from pasa_npu.problem import ROW_NONFINITE, ROW_REPAIRED, AttentionProblem, fp32_problem

F32 = torch.float32
NEG_INF = float("-inf")
_SHIFT_SCORES = contextvars.ContextVar("pasa_npu_torch_shift_scores", default=False)
_KEY_MEANS = contextvars.ContextVar("pasa_npu_torch_key_means", default=False)


@contextlib.contextmanager
def shifting_scores() -> Iterator[None]:
    """Within the block, the PASA allocations apply their shift to each block's fp32 scores
    instead of forming K' (the numerics of the Triton decode kernel's default,
    ``Tuning.decode_shift == "scores"``; :func:`_shift_scores`), in the current thread or
    task only: the backend the tests hold that kernel against."""
    token = _SHIFT_SCORES.set(True)
    try:
        yield
    finally:
        _SHIFT_SCORES.reset(token)


@contextlib.contextmanager
def block_means_from_keys() -> Iterator[None]:
    """Within the block, pasa takes each block mean from the keys (:func:`key_block_means`),
    as the AscendC kernels do where they form K', instead of summing the block's fp16 S', in
    the current thread or task only: the backend the tests hold those kernels against."""
    token = _KEY_MEANS.set(True)
    try:
        yield
    finally:
        _KEY_MEANS.reset(token)


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` and write its output (and LSE) views. With ``problem.overflow``
    set, rows whose result is not finite, or whose shifted scores reached
    :data:`~pasa_npu.numerics.RESOLUTION_LIMIT`, are recomputed by the fa-fp32 path and
    their row flags written (:class:`~pasa_npu.problem.OverflowCheck`)."""
    inputs = _Inputs.of(problem)
    out, lse, peak = _attend(problem, inputs, _prepare_keys(problem, inputs),
                             _step_for(problem.allocation))
    if problem.overflow is not None:
        bad = nonfinite_rows(out, lse) | (peak >= numerics.RESOLUTION_LIMIT)
        flags = torch.zeros(bad.shape, dtype=torch.uint8, device=bad.device)
        if bool(bad.any()):
            out, lse, flags = _repair(problem, inputs, out, lse, bad)
        problem.scatter_rows(flags, problem.overflow.row_flags)
    problem.write(out.to(problem.out.dtype), lse)


def nonfinite_rows(out: torch.Tensor, lse) -> torch.Tensor:
    """Bool (B, Nq, S): rows whose output, or LSE, is NaN or infinite. A row that sees no
    key has output 0 and LSE -inf: not flagged."""
    bad = ~torch.isfinite(out).all(-1)
    if lse is not None:
        bad |= torch.isnan(lse) | (lse == float("inf"))
    return bad


@dataclass
class _Inputs:
    """The dense inputs of a problem and the sizes every pass over it uses."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    n_blocks: int

    @classmethod
    def of(cls, problem: AttentionProblem) -> "_Inputs":
        q, k, v = problem.dense_inputs()
        return cls(q, k, v, max(1, math.ceil(k.shape[2] / problem.tiling.kv_block)))


def _attend(problem: AttentionProblem, inputs: _Inputs, keys: "_Keys", step,
            tiles: torch.Tensor | None = None):
    """Dense (B, Nq, S, Dv) output, (B, Nq, S) LSE and (B, Nq, S) peak (the largest
    |row maximum of S'| over the blocks a row saw; 0 unshifted), in fp32, of the query
    tiles ``tiles`` selects (bool per tile; None: every tile), the others left 0 / -inf / 0."""
    q, v = inputs.q, inputs.v
    batch, n_q, s_q, _ = q.shape
    n_kv, d_v = inputs.k.shape[1], v.shape[3]
    group = n_q // n_kv
    tiling = problem.tiling
    kv_block = tiling.kv_block
    low = problem.compute_dtype
    values = _pad_blocks(v.to(F32), problem.kv_lens, inputs.n_blocks, kv_block)

    out = torch.zeros(batch, n_q, s_q, d_v, dtype=F32, device=q.device)
    lse = torch.full((batch, n_q, s_q), NEG_INF, dtype=F32, device=q.device)
    peak = torch.zeros(batch, n_q, s_q, dtype=F32, device=q.device)
    for t, q0 in enumerate(range(0, s_q, tiling.q_block)):
        if tiles is not None and not bool(tiles[t]):
            continue
        rows = torch.arange(q0, min(q0 + tiling.q_block, s_q), device=q.device)
        # (B, Nkv, G*s1, D): the query group of each kv head stacked along rows
        q_tile = q[:, :, q0:q0 + rows.numel()].to(F32).reshape(batch, n_kv, group * rows.numel(), -1)
        state = _State.empty(problem.allocation, batch, n_kv, group, rows.numel(), d_v, q.device)
        for j in range(inputs.n_blocks):
            cols = torch.arange(j * kv_block, (j + 1) * kv_block, device=q.device)
            vis = problem.visible(rows, cols)[:, None, None]  # (B, 1, 1, s1, s2)
            has_any = vis.any(-1, keepdim=True)
            if not bool(has_any.any()):
                continue
            step(problem, state, q_tile, keys, values[:, :, j], j, vis, has_any, low)
        o_tile, lse_tile = _finish(problem, state, low)
        out[:, :, q0:q0 + rows.numel()] = o_tile.reshape(batch, n_q, rows.numel(), d_v)
        lse[:, :, q0:q0 + rows.numel()] = lse_tile.reshape(batch, n_q, rows.numel())
        peak[:, :, q0:q0 + rows.numel()] = state.peak.reshape(batch, n_q, rows.numel())
    return out, lse, peak


def _repair(problem: AttentionProblem, inputs: _Inputs, out, lse, bad: torch.Tensor):
    """``out`` and ``lse`` (dense) with the rows ``bad`` recomputed by fa-fp32, and the
    dense row flags: 2 where a recomputed row is finite, 3 where it is not (its inputs
    hold NaN or inf), 0 elsewhere."""
    exact = fp32_problem(problem)
    q_block = problem.tiling.q_block
    n_tiles = -(-bad.shape[2] // q_block)
    padded = torch.nn.functional.pad(bad.any(1).any(0), (0, n_tiles * q_block - bad.shape[2]))
    tiles = padded.view(n_tiles, q_block).any(1).cpu()
    out32, lse32, _ = _attend(exact, inputs, _prepare_keys(exact, inputs), _step_fa, tiles)
    out = torch.where(bad[..., None], out32.to(out.dtype), out)
    if lse is not None:
        lse = torch.where(bad, lse32.to(lse.dtype), lse)
    still = nonfinite_rows(out32, lse32) & bad
    flags = torch.where(still, ROW_NONFINITE, ROW_REPAIRED) * bad
    return out, lse, flags.to(torch.uint8)


# --------------------------------------------------------------------------- keys


@dataclass
class _Keys:
    blocks: torch.Tensor          # (B, Nkv, nblk, s2, D): K, or K' for the shifted allocations
    # (B, Nkv, nblk, D): rounded column means (pasa-exact: of K; pasa, block_means_from_keys:
    # of the unrounded K', key_block_means)
    mean16: torch.Tensor | None
    # (B, nblk): 1/valid, the factor that turns a part-filled block's sum of S' into its row
    # mean (pseudo-average shift; NaN for a full or empty block, whose mean is the plain one)
    mean_factor: torch.Tensor | None = None
    # shifting the scores (shifting_scores): blocks holds K, and per (B, nblk) the valid keys
    # and pasa's fp32 (diag + off, off) for that many keys
    valid: torch.Tensor | None = None
    score_map: torch.Tensor | None = None


def _pad_blocks(x: torch.Tensor, lens: torch.Tensor, n_blocks: int, block: int) -> torch.Tensor:
    """(B, N, S, D) -> (B, N, nblk, block, D), zero past each batch's valid length:
    the zero-padded rows a kernel's ragged last block holds (whatever the input holds there,
    NaN included: those rows are never read)."""
    batch, heads, s, d = x.shape
    padded = x.new_zeros(batch, heads, n_blocks * block, d)
    padded[:, :, :s] = x
    valid = torch.arange(n_blocks * block, device=x.device)[None, :] < lens.to(x.device)[:, None]
    padded = torch.where(valid[:, None, :, None], padded, 0.0)
    return padded.view(batch, heads, n_blocks, block, d)


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One rounding to ``dtype``, kept in an fp32 container."""
    return x.to(dtype).to(F32)


def _prepare_keys(problem: AttentionProblem, inputs: _Inputs) -> _Keys:
    """The preprocessing kernel: per kv block, K' = M^T K (pseudo-average shift,
    scale folded into M) or K' = (K - mean16) * scale (exact shift). A part-filled last
    block is shifted as if its missing rows were its keys' mean
    (:func:`pasa_npu.beta.partial_block_shift`; pasa-exact: by the mean of its keys), and
    its padded rows of K' are zero (docs/design.md, "Shifting the keys on the matrix
    engine")."""
    block = problem.tiling.kv_block
    kb = _pad_blocks(inputs.k.to(F32), problem.kv_lens, inputs.n_blocks, block)
    alloc = problem.allocation
    if not alloc.shifts_keys:
        return _Keys(kb, None)
    valid = (problem.kv_lens.to(kb.device)[:, None]
             - torch.arange(inputs.n_blocks, device=kb.device)[None, :] * block).clamp(0, block)
    if _SHIFT_SCORES.get():
        score_map = torch.zeros(*valid.shape, 2, dtype=F32, device=kb.device)
        if alloc.pseudo_average_shift:
            for n in set(valid.flatten().tolist()) - {0}:
                diag, off = (torch.tensor(x, dtype=F32) for x in partial_block_shift(
                    problem.beta, n, block, torch.float16, problem.scale)[:2])
                score_map[valid == n] = torch.stack([diag + off, off]).to(kb.device)
        part_filled = (valid > 0) & (valid < block)
        factor = torch.where(part_filled, 1.0 / valid.double().clamp(min=1), float("nan"))
        return _Keys(kb, None, factor.to(F32), valid, score_map)
    if alloc.pseudo_average_shift:
        m = shift_matrix(problem.beta, block, torch.float16, problem.scale, kb.device).to(F32)
        product = torch.matmul(m.T, kb)  # fp32, accumulated in key order like the cube's
        shifted = _round(product, torch.float16)
        factor = torch.full(valid.shape, float("nan"), dtype=F32, device=kb.device)
        for b, j in ((valid > 0) & (valid < block)).nonzero().tolist():
            n = int(valid[b, j])
            factor[b, j] = partial_block_shift(problem.beta, n, block, torch.float16, problem.scale)[2]
            c = partial_block_correction(problem.beta, n, block, torch.float16, problem.scale)
            colsum = torch.zeros_like(kb[b, :, j, 0])
            for i in range(n):  # in key order, as the cube's row of ones sums them
                colsum = colsum + kb[b, :, j, i]
            shifted[b, :, j] = 0.0
            shifted[b, :, j, :n] = _round(product[b, :, j, :n] - (c * colsum)[:, None], torch.float16)
        means = key_block_means(kb, valid, problem.beta, problem.scale) if _KEY_MEANS.get() else None
        return _Keys(shifted, means, factor)
    count = valid.clamp(min=1).to(F32)[:, None, :, None]
    mean16 = _round(kb.sum(-2) / count, torch.float16)
    shifted = _round((kb - mean16.unsqueeze(-2)) * problem.scale, torch.float16)
    in_block = torch.arange(block, device=kb.device)[None, None, :] < valid[:, :, None]
    return _Keys(shifted * in_block[:, None, :, :, None], mean16)


def key_block_means(kb: torch.Tensor, valid: torch.Tensor, beta: float, scale: float) -> torch.Tensor:
    """pasa's block means taken from the keys: per kv block of ``valid`` keys (zero past them)
    of the zero-padded blocks ``kb`` (B, Nkv, nblk, n, D), the fp16 column mean of the
    unrounded K' over those keys, fl16(colsum(K) * fl32(r / valid)), with colsum summed in fp32
    in key order (the cube's row of ones) and r = diag - (n - 1) off the row sum of the stored
    shift matrix (exact in fp32). K' = M^T K over the valid keys of a full or part-filled
    block has exactly that column mean before rounding, so the row mean of its unrounded
    S' = Q K'^T is Q . mean: the block mean is fl16(Q . mean16), an fp32 dot product
    (docs/design.md, "The block mean from the keys")."""
    n = kb.shape[-2]
    diag, off = shift_matrix_entries(beta, n, torch.float16, scale)
    row_sum = torch.tensor(diag - (n - 1) * off, dtype=F32)
    colsum = torch.zeros_like(kb[..., 0, :])
    for i in range(n):  # in key order, as the cube's row of ones sums them
        colsum = colsum + kb[..., i, :]
    factor = row_sum / valid.clamp(min=1).to(F32)  # one fp32 division: exact for a full block
    return _round(colsum * factor.to(kb.device)[:, None, :, None], torch.float16)


# --------------------------------------------------------------------------- state


@dataclass
class _State:
    """Per-row running statistics (B, Nkv, G, s1, 1) and the output accumulator."""

    m: torch.Tensor
    l: torch.Tensor
    o: torch.Tensor
    f: torch.Tensor      # PASA pseudo-average F of the shifted block means
    n: torch.Tensor      # blocks this row has used
    peak: torch.Tensor   # the resolution check's peak over the blocks used (_peak; shifted only)

    @classmethod
    def empty(cls, allocation, batch, n_kv, group, rows, d_v, device) -> "_State":
        shape = (batch, n_kv, group, rows, 1)
        return cls(m=torch.full(shape, NEG_INF, dtype=F32, device=device),
                   l=torch.zeros(shape, dtype=F32, device=device),
                   o=torch.zeros(batch, n_kv, group, rows, d_v, dtype=F32, device=device),
                   f=torch.zeros(shape, dtype=F32, device=device),
                   n=torch.zeros(shape, dtype=F32, device=device),
                   peak=torch.zeros(shape, dtype=F32, device=device))

    def update(self, has_any: torch.Tensor, **new: torch.Tensor) -> None:
        """Take the new values only for rows that saw a key in this block."""
        for name, value in new.items():
            setattr(self, name, torch.where(has_any, value, getattr(self, name)))


def _scores(q_tile: torch.Tensor, keys: torch.Tensor, shape) -> torch.Tensor:
    """fp32-accumulated Q K^T of one tile, shaped (B, Nkv, G, s1, s2)."""
    return torch.matmul(q_tile, keys.transpose(-1, -2)).view(shape)


def _shift_scores(problem: AttentionProblem, q_tile: torch.Tensor, keys: _Keys, j: int, shape):
    """S' of kv block ``j`` from its fp32 scores Q K^T, as triton.shift.shift_scores forms
    it: pasa / pasa-mixed (diag + off) S - off * rowsum(S) over the block's keys; pasa-exact
    scale * S - c with c = scale * rowsum(S) / valid, returned too (zeros otherwise). The
    columns past the valid keys are 0."""
    raw = _scores(q_tile, keys.blocks[:, :, j], shape)
    row_sum = raw.sum(-1, keepdim=True)
    view = (-1, 1, 1, 1, 1)
    if problem.allocation.exact_shift:
        count = keys.valid[:, j].clamp(min=1).to(F32).view(view)
        c = row_sum / count * problem.scale
        shifted = raw * problem.scale - c
    else:
        a, off = (keys.score_map[:, j, i].view(view) for i in (0, 1))
        shifted, c = a * raw - off * row_sum, torch.zeros_like(row_sum)
    in_block = torch.arange(shape[-1], device=raw.device) < keys.valid[:, j].view(view)
    return torch.where(in_block, shifted, 0.0), c


def _pv(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32-accumulated P V of one tile; p (B, Nkv, G, s1, s2), v (B, Nkv, s2, Dv)."""
    b, n, g, s1, s2 = p.shape
    return torch.matmul(p.reshape(b, n, g * s1, s2), v).view(b, n, g, s1, -1)


def _tile_shape(state: _State, block: int):
    return (*state.m.shape[:-1], block)


def _row_max(s: torch.Tensor, vis: torch.Tensor, problem: AttentionProblem, rnd):
    """(row maximum over visible entries with the rounding guard when enabled, the same
    maximum unguarded); 0 for a row with no visible entry, whose step the state does not
    take (_State.update): a finite maximum keeps the backward pass free of NaN there."""
    masked = s.masked_fill(~vis, NEG_INF)
    rm = torch.where(vis.any(-1, keepdim=True), masked.amax(-1, keepdim=True), 0.0)
    if not problem.rounding_guard:
        return rm, rm
    repeated = ((masked == rm) & vis).sum(-1, keepdim=True) > 1
    offset = torch.where(rm > 0, (numerics.GUARD_FACTOR - 1.0) * rm, -rm)
    offset = offset.clamp(numerics.GUARD_MIN_OFFSET, numerics.GUARD_MAX_OFFSET)
    return torch.where(repeated & torch.isfinite(rm), rnd(rm + offset), rm), rm


def _exp_visible(x: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """exp(x) at the visible entries, 0 elsewhere: a hidden entry's exp never overflows,
    so its zero gradient stays zero (not 0 * inf)."""
    return torch.exp(x.masked_fill(~vis, NEG_INF))


def _peak(state: _State, rm: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
    """``state.peak`` with this block's |unguarded row maximum of the shifted scores| ``rm``
    taken in, and for the pseudo-average shift its |recovered offset| ``offset`` = gamma * the
    block mean of S' (the resolution check's quantities, :data:`pasa_npu.numerics.RESOLUTION_LIMIT`)."""
    block = torch.where(torch.isfinite(rm), rm.abs(), 0.0)
    if offset is not None:
        block = torch.maximum(block, offset.abs())
    return torch.maximum(state.peak, block)


# --------------------------------------------------------------------------- steps


def _step_fa(problem, state, q_tile, keys, v_blk, j, vis, has_any, low):
    """fa-fp32 / fa-fp16s / fa-fp16: FlashAttention-2 with the running maximum."""
    alloc = problem.allocation
    s = _scores(q_tile, keys.blocks[:, :, j], _tile_shape(state, v_blk.shape[-2]))
    if alloc.low_scores:
        s = _round(s, low)  # unscaled fp16 scores: this is where fa-fp16s overflows
    if alloc.low_statistics:
        r = lambda x: _round(x, low)  # noqa: E731
        s = r(s * problem.scale)
        m_new = torch.maximum(state.m, _row_max(s, vis, problem, r)[0])
        a = r(torch.exp(r(state.m - m_new)))
        p = torch.where(vis, r(_exp_visible(r(s - m_new), vis)), 0.0)
        l_new = r(r(a * state.l) + r(p.sum(-1, keepdim=True)))
    else:
        s = s * problem.scale
        rm, unguarded = _row_max(s, vis, problem, lambda x: x)
        m_new = torch.maximum(state.m, rm)
        a = torch.exp(state.m - m_new)
        p = torch.where(vis, _exp_visible(s - m_new, vis), 0.0)
        if problem.rounding_guard:  # a guarded row's l sums the weights P.V uses
            p = torch.where(rm != unguarded, _round(p, low), p)
        l_new = a * state.l + p.sum(-1, keepdim=True)
    if alloc.low_accumulator:
        o_new = _round(_round(a * state.o, low) + _round(_pv(p, v_blk), low), low)
    else:
        o_new = a * state.o + _pv(_round(p, low), v_blk)
    state.update(has_any, m=m_new, l=l_new, o=o_new, n=state.n + 1.0)


def _step_pseudo_average(problem, state, q_tile, keys, v_blk, j, vis, has_any, low):
    """pasa / pasa-mixed: shifted block, local softmax, re-based online (docs/design.md,
    "Recovering the bias online")."""
    fp16_stats = problem.allocation.low_statistics
    r = (lambda x: _round(x, torch.float16)) if fp16_stats else (lambda x: x)
    gamma = ideal_invariance(problem.beta)
    gamma = _round(torch.tensor(gamma), torch.float16).item() if fp16_stats else gamma

    shape = _tile_shape(state, v_blk.shape[-2])
    if keys.score_map is not None:
        s = _round(_shift_scores(problem, q_tile, keys, j, shape)[0], torch.float16)
    else:
        s = _round(_scores(q_tile, keys.blocks[:, :, j], shape), torch.float16)
    if keys.mean16 is not None:  # block_means_from_keys: the mean of the unrounded S'
        s_mean = torch.matmul(q_tile, keys.mean16[:, :, j].unsqueeze(-1)).view(*shape[:-1], 1)
    else:
        factor = keys.mean_factor[:, j]
        s_mean = s.mean(-1, keepdim=True)  # over the block's keys, masked or not
        if bool(torch.isfinite(factor).any()):  # a part-filled block: the mean over its keys
            factor = factor.view(-1, 1, 1, 1, 1)
            s_mean = torch.where(torch.isfinite(factor), s.sum(-1, keepdim=True) * factor, s_mean)
    s_mean = r(s_mean)
    m_loc, rm = _row_max(s, vis, problem, r)
    p = torch.where(vis, r(_exp_visible(r(s - m_loc), vis)), 0.0)
    l_loc = r(p.sum(-1, keepdim=True))

    n = state.n + 1.0
    f_new = r(r(r((n - 1.0) * state.f) + s_mean) / n)
    x = r(state.m + r(gamma * r(state.f - f_new)))
    y = r(m_loc + r(gamma * r(s_mean - f_new)))
    m_new = torch.maximum(x, y)
    a = r(torch.exp(r(x - m_new)))
    b = r(torch.exp(r(y - m_new)))
    l_new = r(r(a * state.l) + r(b * l_loc))
    if problem.allocation.low_accumulator:
        r16 = lambda x: _round(x, torch.float16)  # noqa: E731
        o_new = r16(r16(a * state.o) + r16(b * r16(_pv(p, v_blk))))
    else:
        o_new = a * state.o + b * _pv(_round(p, torch.float16), v_blk)
    state.update(has_any, m=m_new, l=l_new, o=o_new, f=f_new, n=n,
                 peak=_peak(state, rm, offset=gamma * s_mean))


def _step_exact(problem, state, q_tile, keys, v_blk, j, vis, has_any, low):
    """pasa-exact: fully shifted fp16 tile, per-row constant c = scale * Q . mean16 in
    fp32, FA-2 style update against the true running maximum m (fp32).

    The tiles that cross between matrix and vector units (S', P', the P'V
    partial output) are fp16; the running output stays in fp32 in the vector
    unit's local memory, because accumulating it in fp16 grows the error like
    sqrt(n_blocks / 3) unit roundoffs (on small-bias inputs it would lose to
    fa-fp16s)."""
    r16 = lambda x: _round(x, torch.float16)  # noqa: E731
    shape = _tile_shape(state, v_blk.shape[-2])
    if keys.score_map is not None:
        s, c = _shift_scores(problem, q_tile, keys, j, shape)
        s = r16(s)
    else:
        s = r16(_scores(q_tile, keys.blocks[:, :, j], shape))
        c = torch.matmul(q_tile, keys.mean16[:, :, j].unsqueeze(-1)).view(*shape[:-1], 1) * problem.scale
    guarded, rm = _row_max(s, vis, problem, lambda x: x)
    m_new = torch.maximum(state.m, guarded + c)
    a = torch.exp(state.m - m_new)
    p = torch.where(vis, r16(_exp_visible(s - (m_new - c), vis)), 0.0)  # fp32 argument, fp16 P'
    l_new = a * state.l + p.sum(-1, keepdim=True)
    o_new = a * state.o + r16(_pv(p, v_blk))
    state.update(has_any, m=m_new, l=l_new, o=o_new, n=state.n + 1.0, peak=_peak(state, rm))


def _step_for(allocation: numerics.Allocation):
    """The kv-block step of ``allocation``'s shift."""
    if allocation.pseudo_average_shift:
        return _step_pseudo_average
    return _step_exact if allocation.exact_shift else _step_fa


def _finish(problem: AttentionProblem, state: _State, low: torch.dtype):
    """O = O_N / l_N and LSE = true running max + log l (fp32); 0 / -inf for rows
    that saw no key. A learnable sink joins here (docs/design.md, "Learnable sinks"): one
    more column after the last kv block, in no kv block, so PASA's shift and its
    pseudo-average F never see it; it enters in the true frame, after the shift is
    recovered (m + gamma * F), with a zero value, in fp32 like the rest of this step."""
    seen = state.n > 0  # not l > 0: an overflow's NaN must reach the output
    true_max = state.m
    if problem.allocation.pseudo_average_shift:
        gamma = ideal_invariance(problem.beta)
        if problem.allocation.low_statistics:
            gamma = _round(torch.tensor(gamma), torch.float16).item()
        true_max = state.m + gamma * state.f
    l, o = state.l, state.o
    if problem.sink is not None:
        n_kv, group = state.m.shape[1], state.m.shape[2]
        sink = problem.sink.to(device=state.m.device, dtype=F32).view(1, n_kv, group, 1, 1)
        joined = torch.maximum(true_max, sink)
        a = torch.exp(true_max - joined)
        l = a * l + torch.exp(sink - joined)
        o = a * o
        true_max = torch.where(seen, joined, true_max)
    o = torch.where(seen, o / torch.where(seen, l, 1.0), 0.0)
    lse = torch.where(seen, true_max + torch.log(torch.where(seen, l, 1.0)), NEG_INF)
    return o, lse
