"""Decode's shift of the scores (:func:`shift.shift_scores`) hands the online softmax each
row's maximum of S' in fp16 from the reduction that sums the row's scores. That maximum
must be the maximum of the S' tile it returns, bit for bit, with and without FMA
contraction (the kernels of fp32-statistics allocations are compiled with it), for whole
and part-filled blocks and for hidden keys. The tile's maximum is taken here in torch."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from _support import BACKENDS, DEVICE_OF
from pasa_npu.beta import default_beta
from pasa_npu.fallback.triton.shift import _shift_table, shift_scores

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")

ROWS, BLOCK_N = 16, 64
SCALE = 128 ** -0.5


@triton.jit
def _shift_kernel(QK, SEEN, SHIFTED, TOP, diag, off, scale, valid,
                  EXACT_SHIFT: tl.constexpr, PART_FILLED: tl.constexpr,
                  KEYS_HIDDEN: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    tile = rows[:, None] * BLOCK_N + cols[None, :]
    qk = tl.load(QK + tile)
    key_seen = tl.load(SEEN + cols) != 0
    shifted, c, top = shift_scores(qk, key_seen, diag, off, scale, valid, EXACT_SHIFT,
                                   PART_FILLED, KEYS_HIDDEN, BLOCK_N)
    tl.store(SHIFTED + tile, shifted)
    tl.store(TOP + rows, top)


@pytest.mark.parametrize("fp_fusion", [True, False], ids=["fma", "no-fma"])
@pytest.mark.parametrize("exact", [True, False], ids=["pasa-exact", "pasa"])
@pytest.mark.parametrize("valid, hidden", [(BLOCK_N, False), (BLOCK_N, True), (37, True),
                                           (1, True)],
                         ids=["whole", "whole-masked", "part-filled", "one-key"])
def test_block_max_is_the_max_of_the_shifted_scores(fp_fusion, exact, valid, hidden):
    device = DEVICE_OF["triton"]
    gen = torch.Generator().manual_seed(valid * 4 + 2 * exact + hidden)
    # raw scores Q K^T of fp16 inputs at d = 128: wide, with repeated and near-equal maxima
    qk = torch.randn(ROWS, BLOCK_N, generator=gen) * 40.0
    qk[:, 5] = qk[:, 9] = qk.max(1).values + 3.0
    qk[:, 11] = qk[:, 5] + torch.rand(ROWS, generator=gen) * 1e-4
    qk[:, valid:] = 0.0
    seen = torch.arange(BLOCK_N) < valid
    if hidden and valid == BLOCK_N:
        seen &= torch.rand(BLOCK_N, generator=gen) < 0.7
        seen[11] = False  # hide one of the tied maxima
    beta = default_beta(BLOCK_N, SCALE)
    diag, off = _shift_table(beta, BLOCK_N, SCALE, False)[valid, :2].tolist()
    shifted = torch.empty(ROWS, BLOCK_N, device=device)
    top = torch.empty(ROWS, device=device)
    _shift_kernel[(1,)](qk.to(device), seen.to(torch.uint8).to(device), shifted, top, diag,
                        off, SCALE, valid, EXACT_SHIFT=exact, PART_FILLED=valid < BLOCK_N,
                        KEYS_HIDDEN=hidden, ROWS=ROWS, BLOCK_N=BLOCK_N,
                        enable_fp_fusion=fp_fusion)
    s16 = shifted.cpu().half().float()
    expected = torch.where(seen[None, :] if hidden else torch.ones_like(seen), s16,
                           float("-inf")).max(1).values
    assert torch.equal(top.cpu(), expected)
