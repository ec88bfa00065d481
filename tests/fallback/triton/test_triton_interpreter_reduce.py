"""The suite's Triton interpreter (tests/_interpreter.py) reduces with a kernel's own combine
function as a tree of whole-tensor calls: the results are a reduction's, on every axis."""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from pasa_npu.fallback.triton.shift import _sum_and_max  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
    reason="no CUDA GPU and Triton's interpreter is off")


@triton.jit
def _reduce_kernel(X, ROW_SUM, ROW_MAX, COL_SUM, COL_MAX, ALL, ROWS: tl.constexpr,
                   COLS: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    x = tl.load(X + r[:, None] * COLS + c[None, :])
    row_sum, row_max = tl.reduce((x, x), 1, _sum_and_max)
    col_sum, col_max = tl.reduce((x, x), 0, _sum_and_max)
    all_sum, all_max = tl.reduce((x, x), None, _sum_and_max)
    kept_sum, _ = tl.reduce((x, x), 1, _sum_and_max, keep_dims=True)
    tl.store(ROW_SUM + r, row_sum)
    tl.store(ROW_MAX + r, row_max)
    tl.store(COL_SUM + c, col_sum)
    tl.store(COL_MAX + c, col_max)
    tl.store(ALL, all_sum)
    tl.store(ALL + 1, all_max)
    tl.store(ALL + 2 + r[:, None], kept_sum)


@pytest.mark.parametrize("rows, cols", [(16, 32), (1, 64), (8, 1)])
def test_a_tuple_reduce_sums_and_maximises_on_every_axis(rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows + cols))
    out = [torch.zeros(n, device=DEVICE) for n in (rows, rows, cols, cols, 2 + rows)]
    _reduce_kernel[(1,)](x.to(DEVICE), *out, rows, cols)
    row_sum, row_max, col_sum, col_max, rest = (t.cpu().double() for t in out)
    x = x.double()
    # fp32 sums in any order: within cols (rows) roundings of the largest partial sum
    tol = 1e-6 * x.abs().sum().item()
    assert torch.allclose(row_sum, x.sum(1), rtol=0, atol=tol)
    assert torch.allclose(col_sum, x.sum(0), rtol=0, atol=tol)
    assert torch.equal(row_max, x.amax(1)) and torch.equal(col_max, x.amax(0))
    assert abs(rest[0].item() - x.sum().item()) <= tol and rest[1].item() == x.max().item()
    assert torch.allclose(rest[2:], x.sum(1), rtol=0, atol=tol)
