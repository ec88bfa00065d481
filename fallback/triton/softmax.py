"""The online softmax of one kv block, shared by the Triton prefill and decode kernels.

Numerics mirror :mod:`pasa_npu.fallback.torch.blockwise` allocation by allocation: fp16
operands, fp32 accumulation in the tensor cores, rounding to fp16 exactly where the
allocation says. An "fp16 step" of the CPU backend (fp32 arithmetic, one rounding) is
computed here in native fp16 where that gives the same correctly rounded result (+ - * /
of fp16 values). Differences to the CPU backend come only from the order of fp32
accumulation and the hardware exp. The allocation arrives as the constexpr flags of
:func:`pasa_npu.fallback.kernel_common.allocation_flags`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from pasa_npu import numerics
from pasa_npu.fallback.kernel_common import to_fp16_paired, round_low

GUARD_FACTOR = tl.constexpr(numerics.GUARD_FACTOR)
GUARD_MIN = tl.constexpr(numerics.GUARD_MIN_OFFSET)
GUARD_MAX = tl.constexpr(numerics.GUARD_MAX_OFFSET)
RESOLUTION_LIMIT = tl.constexpr(numerics.RESOLUTION_LIMIT)


@triton.jit
def _exp(x):
    """e^x as ``ex2.approx.ftz`` of x * log2(e). ``tl.exp`` emits the same multiply and the
    non-ftz ex2, whose subnormal-range fix-up adds a compare and two multiplies per element
    to the softmax loop; the two differ only where e^x < 2^-126, far below fp16's smallest
    value and below any fp32 sum they enter."""
    return tl.exp2(x * 1.4426950408889634)


@triton.jit
def _guarded_max(s, rm, vis, MASKED: tl.constexpr, GUARD: tl.constexpr, ROUND: tl.constexpr,
                 low: tl.constexpr):
    """Row maximum with the rounding guard (docs/design.md, "The rounding guard"), in
    natural-log units."""
    if GUARD:
        tie = s == rm[:, None]
        if MASKED:
            tie = tie & vis
        ties = tl.sum(tie.to(tl.int32), 1)
        offset = tl.where(rm > 0, (GUARD_FACTOR - 1.0) * rm, -rm)
        offset = tl.minimum(tl.maximum(offset, GUARD_MIN), GUARD_MAX)
        guarded = rm + offset
        if ROUND:
            guarded = round_low(guarded, low)
        rm = tl.where((ties > 1) & (rm > float("-inf")), guarded, rm)
    return rm


# Over 80 lines: one body for every allocation; split per allocation, the same operations
# compile to other sm_90 SASS than the kernels were measured with (see its body).
@triton.jit
def block_update(qk, v, c, vis, row_any, m, l, acc, f, cnt, scale, gamma, mean_factor,
                  PSEUDO_AVERAGE_SHIFT: tl.constexpr, EXACT_SHIFT: tl.constexpr,
                  LOW_SCORES: tl.constexpr, LOW_STATISTICS: tl.constexpr,
                  MASKED: tl.constexpr, GUARD: tl.constexpr, BLOCK_N: tl.constexpr,
                  CHECK: tl.constexpr, block_max=0.0, BLOCK_MAX_GIVEN: tl.constexpr = False):
    """One kv block of online softmax for the allocation the flags name
    (:func:`pasa_npu.fallback.kernel_common.allocation_flags`), from the block's scores
    ``qk``: Q K^T, or S' for the PASA allocations (fp32). Rows that see no key of the
    block (MASKED only: ``row_any`` False) keep their state. ``c``: pasa-exact's per-row
    constant of this block, the shift S' took off (fp32). ``mean_factor``: (MASKED
    pasa and pasa-mixed) the factor that turns the block's sum of S' into its row mean,
    1/BLOCK_N for a full block, other for a part-filled one
    (:func:`pasa_npu.fallback.triton.shift.cached_shift_table`); an interior block divides
    by BLOCK_N. With low-precision
    statistics (fa-fp16, pasa) ``acc`` is fp16 too and the steps run as native fp16
    operations: each rounds once, as the CPU backend's fp32-then-round steps do (the
    kernels are launched without FMA contraction). CHECK (a checked shifted allocation):
    a row whose block maximum of S', or (pasa, pasa-mixed) whose block offset gamma * mean
    S', lost resolution (:func:`lost_resolution`) gets a NaN running sum, which the
    overflow check's row test flags. BLOCK_MAX_GIVEN (the shifted
    allocations): ``block_max`` is that maximum over the visible keys, as its fp16 value
    in fp32, found with the scores' shift (:func:`pasa_npu.fallback.triton.shift.shift_scores`);
    pasa then sums S' for its mean in the same reduction as P, two barrier round trips
    fewer per block where a row is spread over several warps (decode). Returns the new
    state."""
    # one body for every allocation: split into a helper per allocation, the same
    # operations compile to other sm_90 SASS (register allocation and schedule), and the
    # kernels are kept as they were measured
    low: tl.constexpr = v.dtype  # fp16, or bf16 for fa-* on bf16 inputs
    if not (PSEUDO_AVERAGE_SHIFT or EXACT_SHIFT or LOW_STATISTICS):  # fa-fp32, fa-fp16s
        if LOW_SCORES:
            qk = round_low(qk, low)  # fp16 unscaled scores: overflow happens here
        s = qk * scale
        if MASKED:
            s = tl.where(vis, s, float("-inf"))
        rm = _guarded_max(s, tl.max(s, 1), vis, MASKED, GUARD, False, low)
        m_new = tl.maximum(m, rm)
        alpha = tl.exp2((m - m_new) * 1.4426950408889634)
        # the exponent's fused multiply-add spelled out: with FMA contraction the compiler
        # may fuse either product, and without it (a repair inside pasa's decode) neither
        p = tl.exp2(tl.fma(s, 1.4426950408889634, -(m_new * 1.4426950408889634)[:, None]))
        if GUARD:  # a guarded row's l sums the weights P.V uses ("The rounding guard")
            p = tl.where((rm != tl.max(s, 1))[:, None], p.to(low).to(tl.float32), p)
        l_new = alpha * l + tl.sum(p, 1)
        acc_new = acc * alpha[:, None] + fp32_product(p.to(low), v)
        f_new = f
    elif not (PSEUDO_AVERAGE_SHIFT or EXACT_SHIFT):  # fa-fp16: every step fp16
        s = round_low(round_low(qk, low) * scale, low)
        if MASKED:
            s = tl.where(vis, s, float("-inf"))
        rm = _guarded_max(s, tl.max(s, 1), vis, MASKED, GUARD, True, low)
        m_new = tl.maximum(m, rm)
        alpha = round_low(_exp(round_low(m - m_new, low)), low)
        p = round_low(_exp(round_low(s - m_new[:, None], low)), low)
        l_new = round_low(round_low(alpha * l, low) + round_low(tl.sum(p, 1), low), low)
        pv = tl.dot(p.to(low), v).to(low)
        acc_new = acc * alpha.to(low)[:, None] + pv
        f_new = f
    elif PSEUDO_AVERAGE_SHIFT:  # pasa (fp16 statistics), pasa-mixed (fp32 statistics)
        sp16 = to_fp16_paired(qk)
        sp = sp16.to(tl.float32)
        key_scores = sp  # the block's keys', masked or not (a part-filled block's padded columns are 0)
        if not BLOCK_MAX_GIVEN:
            s_mean = _row_mean(tl.sum(key_scores, 1), mean_factor, MASKED, LOW_STATISTICS,
                               BLOCK_N, low)
        if MASKED:
            sp = tl.where(vis, sp, float("-inf"))
            sp16 = tl.where(vis, sp16, float("-inf"))
        if BLOCK_MAX_GIVEN:
            rm = block_max
        else:  # the max of fp16 values is an fp16 value: packed fp16 max, the same result
            rm = tl.max(sp16, 1).to(tl.float32)
        m_loc = _guarded_max(sp, rm, vis, MASKED, GUARD, LOW_STATISTICS, low)
        cnt1 = cnt + 1.0
        if LOW_STATISTICS:
            p16 = _exp((sp16 - m_loc.to(low)[:, None]).to(tl.float32)).to(low)
            if MASKED:
                p16 = tl.where(vis, p16, 0.0)
            if BLOCK_MAX_GIVEN:
                key_sum, p_sum = tl.reduce((key_scores, p16.to(tl.float32)), 1, _add_pairs)
                s_mean = _row_mean(key_sum, mean_factor, MASKED, LOW_STATISTICS, BLOCK_N, low)
            else:
                p_sum = tl.sum(p16.to(tl.float32), 1)
            l_loc = round_low(p_sum, low)
            f_new = round_low(round_low(round_low((cnt1 - 1.0) * f, low) + s_mean, low) / cnt1, low)
            x = round_low(m + round_low(gamma * round_low(f - f_new, low), low), low)
            y = round_low(m_loc + round_low(gamma * round_low(s_mean - f_new, low), low), low)
            m_new = tl.maximum(x, y)
            alpha = round_low(_exp(round_low(x - m_new, low)), low)
            beta_w = round_low(_exp(round_low(y - m_new, low)), low)
            l_new = round_low(round_low(alpha * l, low) + round_low(beta_w * l_loc, low), low)
            pv = to_fp16_paired(tl.dot(p16, v))
            acc_new = acc * alpha.to(low)[:, None] + pv * beta_w.to(low)[:, None]
        else:
            p = _exp(sp - m_loc[:, None])
            if BLOCK_MAX_GIVEN:
                key_sum, l_loc = tl.reduce((key_scores, p), 1, _add_pairs)
                s_mean = _row_mean(key_sum, mean_factor, MASKED, LOW_STATISTICS, BLOCK_N, low)
            else:
                l_loc = tl.sum(p, 1)
            f_new = ((cnt1 - 1.0) * f + s_mean) / cnt1
            x = m + gamma * (f - f_new)
            y = m_loc + gamma * (s_mean - f_new)
            m_new = tl.maximum(x, y)
            alpha = _exp(x - m_new)
            beta_w = _exp(y - m_new)
            l_new = alpha * l + beta_w * l_loc
            acc_new = acc * alpha[:, None] + tl.dot(p.to(low), v) * beta_w[:, None]
    else:  # pasa-exact: per-row constant c carried in fp32, FA-2 update
        sp16 = to_fp16_paired(qk)
        if MASKED:
            sp16 = tl.where(vis, sp16, float("-inf"))
        if BLOCK_MAX_GIVEN:
            rm = block_max
        else:
            rm = tl.max(sp16, 1).to(tl.float32)  # the max of fp16 values is an fp16 value
        sp = sp16.to(tl.float32)
        m_new = tl.maximum(m, _guarded_max(sp, rm, vis, MASKED, GUARD, False, low) + c)
        alpha = tl.exp2((m - m_new) * 1.4426950408889634)
        # as fa-fp32's exponent: one fused multiply-add, spelled out
        p16 = tl.exp2(tl.fma(sp, 1.4426950408889634,
                             -((m_new - c) * 1.4426950408889634)[:, None])).to(low)
        l_new = alpha * l + tl.sum(p16.to(tl.float32), 1)
        acc_new = acc * alpha[:, None] + to_fp16_paired(tl.dot(p16, v)).to(tl.float32)
        f_new = f
    if CHECK:
        if PSEUDO_AVERAGE_SHIFT:
            lost = pseudo_average_lost_resolution(rm, gamma, s_mean)
        else:
            lost = lost_resolution(rm)
        l_new = tl.where(lost, float("nan"), l_new)
    cnt_new = cnt + 1.0
    if MASKED:
        m_new = tl.where(row_any, m_new, m)
        l_new = tl.where(row_any, l_new, l)
        acc_new = tl.where(row_any[:, None], acc_new, acc)
        f_new = tl.where(row_any, f_new, f)
        cnt_new = tl.where(row_any, cnt_new, cnt)
    return m_new, l_new, acc_new, f_new, cnt_new


@triton.jit
def fp32_product(a, b):
    """a @ b in fp32 from fp16 (or bf16) operands: a matmul with fp32 accumulation, or,
    where ``a`` is one row (a decode repair's), the exact fp32 products summed in fp32, so
    that the kernel holds no second kind of matrix instruction for a path that rarely runs."""
    if a.shape[0] == 1:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], 1)
    return tl.dot(a, b)


@triton.jit
def _row_mean(total, mean_factor, MASKED: tl.constexpr, LOW_STATISTICS: tl.constexpr,
              BLOCK_N: tl.constexpr, low: tl.constexpr):
    """pasa's block mean of S' from the row sum ``total`` of its keys' S'."""
    if MASKED:
        s_mean = total * mean_factor
    else:
        s_mean = total / BLOCK_N
    if LOW_STATISTICS:
        s_mean = round_low(s_mean, low)
    return s_mean


@triton.jit
def _add_pairs(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def lost_resolution(rm):
    """Per row: its block maximum of S' ``rm`` (or a pseudo-average block offset) reached
    RESOLUTION_LIMIT in magnitude, where fp16 cannot resolve the softmax
    (:data:`pasa_npu.numerics.RESOLUTION_LIMIT`). One compare: a row that saw no key of the
    block (``rm`` -inf) is true here, and its caller keeps that row's state."""
    return tl.abs(rm) >= RESOLUTION_LIMIT


@triton.jit
def pseudo_average_lost_resolution(rm, gamma, s_mean):
    """Per row, pasa and pasa-mixed: its block maximum of S' ``rm`` or the block offset it
    recovers, ``gamma`` times the block mean ``s_mean``, lost resolution
    (:func:`lost_resolution`)."""
    return lost_resolution(rm) | lost_resolution(gamma * s_mean)


@triton.jit
def initial_state(ROWS: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                   LOW_ACCUMULATOR: tl.constexpr, low: tl.constexpr):
    """Empty online-softmax state (m, l, acc, f, cnt) and pasa-exact's row constant c;
    a low-precision accumulator is kept in ``low``."""
    m = tl.full([ROWS], float("-inf"), tl.float32)
    zeros = tl.zeros([ROWS], tl.float32)
    if LOW_ACCUMULATOR:
        acc = tl.zeros([ROWS, HEAD_DIM_V], low)
    else:
        acc = tl.zeros([ROWS, HEAD_DIM_V], tl.float32)
    return m, zeros, acc, zeros, zeros, zeros


@triton.jit
def finish_rows(m, l, acc, f, cnt, gamma, sink, PSEUDO_AVERAGE_SHIFT: tl.constexpr,
            HAS_SINK: tl.constexpr):
    """Normalised output and LSE; 0 and -inf for rows that saw no key. HAS_SINK: the rows'
    learnable sink ``sink`` joins in fp32 in the true frame, after the recovery, as one
    more column with a zero value (docs/design.md, "Learnable sinks")."""
    seen = cnt > 0
    true_max = m
    if PSEUDO_AVERAGE_SHIFT:
        true_max = m + gamma * f
    if HAS_SINK:
        joined = tl.maximum(true_max, sink)
        rebase = tl.exp(true_max - joined)
        l = rebase * l + tl.exp(sink - joined)
        acc = acc * rebase[:, None]
        true_max = tl.where(seen, joined, true_max)
    l_safe = tl.where(seen, l, 1.0)
    o = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(seen, true_max + tl.log(l_safe), float("-inf"))
    return o, lse


@triton.jit
def nonfinite_row_mask(o, lse):
    """Per row: its output or LSE is NaN or infinite (the overflow check; a row that saw
    no key has output 0 and LSE -inf, and is not flagged). One fp32 sum per row of its
    output values and its LSE (-inf taken as 0: a row that saw keys and has LSE -inf has a
    non-finite output): NaN or infinite exactly where one of them is, as values an fp16
    output and an LSE can hold never sum past fp32's range."""
    return ~(tl.abs(tl.sum(o, 1) + tl.where(lse == float("-inf"), 0.0, lse)) < float("inf"))


@triton.jit
def nonfinite_lse(lse):
    """Per row: its LSE is NaN or +inf (-inf, a row that saw no key, is not flagged, as
    :func:`nonfinite_row_mask` takes it)."""
    return ~(tl.abs(tl.where(lse == float("-inf"), 0.0, lse)) < float("inf"))


@triton.jit
def block_row_constant(q, mean, scale):
    """pasa-exact's c = scale * (Q . mean16) for one block: a thin extra matmul column with
    fp32 accumulation; the other 15 columns are zero, so the row sum is column 0 exactly."""
    col = tl.arange(0, 16)
    mean_tile = tl.where(col[None, :] == 0, mean[:, None], 0.0).to(q.dtype)
    return tl.sum(tl.dot(q, mean_tile), 1) * scale
