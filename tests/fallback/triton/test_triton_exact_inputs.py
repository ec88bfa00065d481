"""Inputs on which every intermediate of an allocation is exact, in fp32 and in fp16, except
the roundings the allocation prescribes: no sum order, exp or log can differ between two
implementations, so the Triton kernels must equal the torch backend bit for bit, on any CPU
and on a GPU, and so must the AscendC kernels' emulation for the allocations they run. The derived bounds (tests/_bounds.py) must allow a rounding that flips; here
nothing can flip, so a rounding dropped from a kernel shows.

The construction: Q has one nonzero component, so every score is one product; in each kv
block a few "hot" keys share the block's largest score and the others sit far below it, so
that every weight is exp(0) = 1 or underflows to 0; keys, values and scores are dyadic
numbers with few bits. What is left are the roundings under test, each given inputs on
which it matters (checked here in fp64 before the kernels run)."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import BACKENDS, on_device

#: the backends held to the torch backend here; the AscendC kernels run pasa and pasa-exact
EXACT_BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(b not in BACKENDS, reason=f"{b} is not built"))
                  for b in ("triton", "ascendc-emu")]

BLOCK, BLOCKS, HOT, D = 16, 4, 3, 32
ROWS = 16
SCALE = 0.25


def _pasa_exact_inputs(seed: int, keys: int = BLOCKS * BLOCK):
    """BNSD (1, 1, ROWS, D) Q and (1, 1, keys, D) K, V for pasa-exact, in BLOCKS kv blocks.
    Key column 0 is 0 for the HOT keys of a block and -8 for the others: the block mean is
    -6.5, K' = (K - mean) * scale is 1.625 / -0.375, S' = 64 K' is 104 / -24, the row
    constant c = scale * Q . mean = -104, so P' = exp(S' - (m - c)) is exactly 1 or 0. A
    part-filled last block of 8 keys (``keys`` 56): its mean over its keys -5, K' 1.25 /
    -0.75, S' 80 / -48, c = -80, P' again 1 or 0. V's hot rows hold 11-bit values, so that
    a block's P'V tile (the sum of three) needs 13 bits."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.zeros(1, 1, ROWS, D)
    q[..., 0] = 64.0
    k = torch.zeros(1, 1, keys, D)
    hot = (torch.arange(keys) % BLOCK) < HOT
    k[0, 0, ~hot, 0] = -8.0
    v = torch.randint(-2047, 2048, (1, 1, keys, D), generator=gen) * 2.0 ** -10
    return q.half(), k.half(), v.half(), hot


def _pasa_exact_expected(v, hot, round_tile: bool) -> torch.Tensor:
    """The output row in fp64: the sum over blocks of each block's P'V tile (its hot rows'
    sum, rounded to fp16 where ``round_tile``), over l = the number of hot keys."""
    tiles = v[0, 0].double()[hot].view(BLOCKS, HOT, D).sum(1)
    if round_tile:
        tiles = tiles.half().double()
    return (tiles.sum(0) / (BLOCKS * HOT)).half()


def _assert_equals_cpu(q, k, v, algorithm: str, lse_ulps: int,
                      backend: str = "triton") -> torch.Tensor:
    """``backend``'s output equal to the torch backend's bit for bit, and its LSE within
    ``lse_ulps`` fp32 ulps of its scale (0: equal; else its last step, an fp32 log, may
    differ between libms by an ulp). Returns the torch backend's output and LSE. Unchecked:
    pasa's inputs here have block offsets past the resolution limit on purpose, so that the
    offsets' roundings show, and the check would recompute their rows by fa-fp32."""
    kw = dict(num_heads=1, input_layout="BNSD", scale=SCALE, algorithm=algorithm,
              kv_block=BLOCK, rounding_guard=False, softmax_lse_flag=True, repair_overflow=False)
    ref, ref_lse = pasa_npu.fused_attention(q, k, v, backend="torch", **kw)
    out, lse = pasa_npu.fused_attention(*on_device(backend, q, k, v), backend=backend, **kw)
    assert torch.equal(out.cpu(), ref)
    lse_err = float((lse.cpu().double() - ref_lse.double()).abs().max())
    assert lse_err <= lse_ulps * 2.0 ** -23 * float(ref_lse.abs().max()), (lse_err, algorithm)
    return ref, ref_lse


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
@pytest.mark.parametrize("keys", [BLOCKS * BLOCK, BLOCKS * BLOCK - BLOCK // 2],
                         ids=["whole-blocks", "part-filled"])
@pytest.mark.parametrize("seed", [0, 1])
def test_pasa_exact_equals_the_cpu_backend_bit_for_bit(seed, keys, backend):
    q, k, v, hot = _pasa_exact_inputs(seed, keys)
    expected = _pasa_exact_expected(v, hot, round_tile=True)
    # the case is sensitive to the P'V tile's rounding: without it some outputs differ
    assert (expected != _pasa_exact_expected(v, hot, round_tile=False)).any()
    ref, _ = _assert_equals_cpu(q, k, v, "pasa-exact", lse_ulps=0, backend=backend)
    assert torch.equal(ref[0, 0], expected.expand(ROWS, D))  # the premise: all exact


#: pasa, one block of 16 keys: key column 0 (three hot keys first), found so that the block's
#: mean of S' is not an fp16 value and its rounding survives into the block maximum's
#: re-basing y = m + gamma (s_mean - F) (checked below)
PASA_KEYS = (-243.0, -243.0, -243.0, -261.0, -252.0, -255.0, -260.0, -252.0, -261.0, -252.0,
             -261.0, -253.0, -256.0, -256.0, -257.0, -254.0)


def _pasa_inputs(key_column, seed: int):
    """BNSD (1, 1, ROWS, D) Q = 16 e0 and (1, 1, keys, D) K whose column 0 is ``key_column``
    (integers) and the rest 0, V of 11-bit values, fp16."""
    keys = len(key_column)
    q = torch.zeros(1, 1, ROWS, D)
    q[..., 0] = 16.0
    k = torch.zeros(1, 1, keys, D)
    k[0, 0, :, 0] = torch.tensor(key_column)
    v = torch.randint(-2047, 2048, (1, 1, keys, D), generator=torch.Generator().manual_seed(seed))
    return q.half(), k.half(), (v * 2.0 ** -10).half()


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_pasa_equals_the_cpu_backend_bit_for_bit(backend):
    """pasa (every statistic an fp16 step): K' = M^T K is exact in fp32 for integer keys
    (M's fp16 entries have 12 fractional bits), so is S' = 16 K' and its block sum; the
    hot keys' P' is exp(0) = 1, the others' 0. The block mean s = sum / 16 then needs more
    bits than fp16 has: its rounding moves y, and so the LSE, by about gamma (s - fp16(s)).
    Output bit for bit; LSE to its last step, an fp32 log (1 ulp apart between libms)."""
    from pasa_npu.beta import default_beta, ideal_invariance, shift_matrix

    q, k, v = _pasa_inputs(PASA_KEYS, seed=3)
    # the case is what it claims: S' exact, the mean not an fp16 value, its residue visible
    shift = shift_matrix(default_beta(BLOCK, SCALE), BLOCK, torch.float16, SCALE, "cpu").double()
    s = 16 * (shift.T @ k[0, 0, :, 0].double()).half().double()
    assert (s[:HOT] == s.max()).all() and s.max() - s[HOT:].max() > 20  # P' exactly 1 or 0
    mean = s.sum() / BLOCK
    gamma = float(torch.tensor(ideal_invariance(default_beta(BLOCK, SCALE))).half())
    residue = (gamma * (mean - mean.half().double())).half().double()
    assert float((s.max() + residue).half()) != float(s.max().half())
    _assert_equals_cpu(q, k, v, "pasa", lse_ulps=2, backend=backend)


#: pasa's part-filled last block: 8 keys after PASA_KEYS' block (key column 0), their scores
#: far below its hot keys', so that the block adds nothing to O or l (alpha = 1, beta = 0)
#: and reaches the LSE through its mean alone, in F's fp16 steps (checked below)
PASA_TAIL_KEYS = (-314.0, -316.0, -292.0, -306.0, -322.0, -321.0, -315.0, -309.0)


def _fp16_steps_lse(blocks, gamma: float) -> tuple[float, tuple]:
    """pasa's LSE from its blocks' (local maximum, fp16 mean, fp16 sum of P') of S', every
    step of fallback/torch/blockwise.py's pseudo-average update in fp64 rounded to fp16 as
    there, the last two (m + gamma F, + log l) in fp32; and the last block's (alpha, beta)."""
    import math

    m, l, f, weights = -math.inf, 0.0, 0.0, None
    for count, (m_loc, mean, l_loc) in enumerate(blocks, start=1):
        f_new = _fp16(_fp16(_fp16((count - 1) * f) + mean) / count)
        x = _fp16(m + _fp16(gamma * _fp16(f - f_new))) if count > 1 else -math.inf
        y = _fp16(m_loc + _fp16(gamma * _fp16(mean - f_new)))
        top = max(x, y)
        weights = (_fp16(math.exp(_fp16(x - top))) if count > 1 else 0.0,
                   _fp16(math.exp(_fp16(y - top))))
        l = _fp16(_fp16(weights[0] * l) + _fp16(weights[1] * l_loc))
        m, f = top, f_new
    return _fp32(_fp32(m + _fp32(gamma * f)) + _fp32(math.log(l))), weights


def _pasa_block(keys, diag_plus_off: float, off: float, mean_factor: float) -> tuple:
    """(local maximum, fp16 mean, fp16 sum of P') of S' = 16 K' for Q = 16 e0 and key column
    0 ``keys``: K'_i = diag_plus_off K_i - off sum(K), each step exact in fp32 (asserted),
    rounded once to fp16."""
    import math

    total = sum(keys)
    shifted = []
    for key in keys:
        a, b = diag_plus_off * key, off * total
        assert all(_fp32(x) == x for x in (a, b, a - b))  # the kernels' fp32 steps are exact
        shifted.append(16 * _fp16(a - b))
    m_loc = max(shifted)
    return (m_loc, _fp16(sum(shifted) * mean_factor),
            _fp16(sum(_fp16(math.exp(_fp16(s - m_loc))) for s in shifted)))


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_pasa_part_filled_block_equals_the_cpu_backend_bit_for_bit(backend):
    """pasa over a whole block and a part-filled one of 8 keys, which is shifted with the
    entries for its 8 keys (:func:`pasa_npu.beta.partial_block_shift`) and averaged over
    them: the LSE, computed here step by step from the inputs, differs by far more than its
    fp32 rounding where the kernels took the whole block's entries or its mean factor
    1/16 instead. Output bit for bit; LSE to its fp32 log."""
    from pasa_npu.beta import (default_beta, ideal_invariance, partial_block_shift,
                               shift_matrix_entries)

    beta = default_beta(BLOCK, SCALE)
    gamma = _fp16(ideal_invariance(beta))
    diag, off = shift_matrix_entries(beta, BLOCK, torch.float16, SCALE)
    tail_diag, tail_off, tail_factor = partial_block_shift(beta, len(PASA_TAIL_KEYS), BLOCK,
                                                           torch.float16, SCALE)
    head = _pasa_block(PASA_KEYS, diag + off, off, 1 / BLOCK)
    lse, weights = _fp16_steps_lse(
        [head, _pasa_block(PASA_TAIL_KEYS, _fp32(tail_diag) + _fp32(tail_off), _fp32(tail_off),
                           tail_factor)], gamma)
    assert weights == (1.0, 0.0)  # the tail block adds nothing to O and l
    wrong_entries = _fp16_steps_lse(
        [head, _pasa_block(PASA_TAIL_KEYS, diag + off, off, tail_factor)], gamma)[0]
    wrong_factor = _fp16_steps_lse(
        [head, _pasa_block(PASA_TAIL_KEYS, _fp32(tail_diag) + _fp32(tail_off), _fp32(tail_off),
                           1 / BLOCK)], gamma)[0]
    assert min(abs(lse - wrong_entries), abs(lse - wrong_factor)) > 1e3 * 2.0 ** -23 * abs(lse)
    q, k, v = _pasa_inputs(PASA_KEYS + PASA_TAIL_KEYS, seed=4)
    _, ref_lse = _assert_equals_cpu(q, k, v, "pasa", lse_ulps=2, backend=backend)
    # the torch backend's LSE is the one worked out above
    assert float((ref_lse.double() - lse).abs().max()) <= 2 * 2.0 ** -23 * abs(lse)


#: fa-fp16, two blocks of 16 keys: the scores (k0 * scale with Q = e0), the first block's key
#: 0 the maximum 0, every other score below it, so that alpha = exp(0) = 1 and each P an fp16
#: value that no exp within a few fp32 ulps rounds otherwise (checked below)
FA_FP16_SCORES = (
    (0.0, -1.75, -3.25, -1.4375, -0.9375, -3.125, -0.5, -1.125, -0.3125, -2.25, -3.0, -1.0,
     -3.3125, -1.1875, -0.375, -2.5),
    (-0.3125, -1.25, -1.6875, -3.75, -3.9375, -0.375, -3.3125, -3.0625, -0.1875, -0.125,
     -3.875, -3.3125, -1.875, -3.125, -2.0, -1.8125))


def _fp16(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float64).half())


def _fp32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float64).float())


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")
def test_fa_fp16_equals_the_cpu_backend_bit_for_bit():
    """fa-fp16 (every step fp16): l = fp16(fp16(alpha l) + fp16(sum P)) over two blocks,
    whose second block's sum of P needs more bits than fp16 has, and whose rounding before
    the addition changes l (double rounding). Output bit for bit; LSE to its fp32 log."""
    import math

    for block in FA_FP16_SCORES:  # each P = fp16(e^s) far from an fp16 rounding midpoint
        for s in block:
            e = math.exp(s)
            p = torch.tensor(_fp16(e), dtype=torch.float16)
            up = float(torch.nextafter(p, torch.tensor(math.inf, dtype=torch.float16)))
            down = float(torch.nextafter(p, torch.tensor(-math.inf, dtype=torch.float16)))
            assert min(abs(e - (float(p) + up) / 2), abs(e - (float(p) + down) / 2)) > 1e-5 * e
    sums = [sum(_fp16(math.exp(s)) for s in block) for block in FA_FP16_SCORES]
    l1 = _fp16(sums[0])
    assert _fp16(l1 + _fp16(sums[1])) != _fp16(l1 + sums[1])  # the inner rounding matters
    q = torch.zeros(1, 1, ROWS, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2 * BLOCK, D)
    k[0, 0, :, 0] = torch.tensor(FA_FP16_SCORES).flatten() / SCALE
    v = torch.randint(-255, 256, (1, 1, 2 * BLOCK, D), generator=torch.Generator().manual_seed(5))
    q, k, v = q.half(), k.half(), (v * 2.0 ** -8).half()
    _assert_equals_cpu(q, k, v, "fa-fp16", lse_ulps=2)
