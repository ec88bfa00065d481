"""Each emulated AscendC vector instruction the kernels use, run on operands given here in an
AIV core of the emulation (run_vector_instruction of the self-test module,
tests/_emu_selftest.py), against an independent model of its documented numerics and order."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pasa_npu import npu_params

from _emu_selftest import selftest_module

TIMING = npu_params.timing_only(npu_params.values())

# Each emulated vector instruction the kernels use, on operands given here, against an
# independent model of its documented numerics (ascend_kernels/emu/emu_ops_move.h): arithmetic on
# half computed in fp32 and rounded once to half (to nearest, ties to even), on float the
# IEEE fp32 operation; Exp and Ln the fp32 functions; casts to 16 bits to nearest even;
# ReduceSum a binary tree of adjacent pairs in each 256-byte repeat, the repeats added in
# order, each addition rounded to the operand type; Max and ReduceMax propagating NaN.


def _vector(op, dtype, a, b=(), scalar=0.0, chunk=4096):
    """The instruction on ``a`` (and ``b``), ``chunk`` elements per run (UB holds so many)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.size > chunk:
        return np.concatenate([_vector(op, dtype, a[i:i + chunk], b[i:i + chunk] if b.size else b,
                                       scalar, chunk) for i in range(0, a.size, chunk)])
    return np.array(selftest_module().run_vector_instruction(op, dtype, a.tolist(), b.tolist(),
                                                             float(scalar), TIMING),
                    np.float32)


def _operands(dtype, n=4096, seed=0, low=-1e3, high=1e3, ties=True):
    """Random operands exact in ``dtype`` over several binades; for half, the first 64 are
    1 + k ulp, to which 2^-11 adds an exact tie between two halves."""
    rng = np.random.default_rng(seed)
    mags = np.exp2(rng.uniform(-8, np.log2(high), n)) * rng.choice([-1, 1], n)
    x = np.clip(mags, low, high).astype(np.float32)
    if dtype == "half":
        x = x.astype(np.float16).astype(np.float32)
        if ties:
            x[:min(n, 64)] = 1.0 + np.arange(min(n, 64), dtype=np.float32) * 2.0 ** -10
    return x


def _half(x):
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
          "Max": np.maximum}


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("op", list(BINARY))
def test_vector_binary_instructions_round_once(op, dtype):
    a, b = _operands(dtype, seed=1), _operands(dtype, seed=2)
    b[:64] = 2.0 ** -11 if op != "Div" else 3.0   # the half ties of Add and Sub
    a[65] = b[64] = np.nan                          # NaN propagates from either (Max too)
    with np.errstate(all="ignore"):
        want = BINARY[op](a, b).astype(np.float32)  # the exact fp32 operation
    if dtype == "half":
        want = _half(want)
    got = _vector(op, dtype, a, b)
    assert np.array_equal(got, want, equal_nan=True), np.flatnonzero(got != want)[:5]


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("op", ["Adds", "Muls"])
def test_vector_scalar_instructions_round_once(op, dtype):
    a = _operands(dtype, seed=3)
    scalar = 2.0 ** -11 if op == "Adds" else 0.1   # Adds: ties on 1 + k ulp; Muls: inexact
    s = np.float32(_half(scalar) if dtype == "half" else scalar)
    want = (a + s) if op == "Adds" else (a * s)
    want = _half(want) if dtype == "half" else want.astype(np.float32)
    assert np.array_equal(_vector(op, dtype, a, scalar=scalar), want)


def test_vector_exp_and_ln_on_half_round_the_fp32_function_once():
    """Every half input in range: expf/logf of the fp32 value, rounded once to half; the
    correctly rounded fp32 function (fp64, rounded once) gives the same half for all."""
    every = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    exp_args = every[np.isfinite(every) & (np.abs(every) <= 11)]
    ln_args = every[np.isfinite(every) & (every > 0)]
    for op, args, f in (("Exp", exp_args, np.exp), ("Ln", ln_args, np.log)):
        want = _half(f(args.astype(np.float64)).astype(np.float32))
        assert np.array_equal(_vector(op, "half", args), want), op


def test_vector_exp_and_ln_on_float_are_the_fp32_functions():
    """On float: within one ulp of the correctly rounded function (glibc's expf and logf are
    within about half an ulp) and equal to it on all but at most 4 of these 4096 arguments
    each (measured: Exp 1, Ln 0; the same allowance for Ln, whose libm may differ)."""
    rng = np.random.default_rng(4)
    for op, args, f in (("Exp", rng.uniform(-87, 88, 4096), np.exp),
                        ("Ln", np.exp2(rng.uniform(-100, 100, 4096)), np.log)):
        args = args.astype(np.float32)
        want = f(args.astype(np.float64)).astype(np.float32)
        got = _vector(op, "float", args)
        ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want))
        assert ulps.max() <= 1 and np.count_nonzero(got != want) <= 4, (op, ulps.max())


@pytest.mark.parametrize("conversion", ["float->half", "float->bfloat16", "half->float"])
def test_vector_cast_rounds_to_nearest_even(conversion):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(4096) * 1e3).astype(np.float32)
    if conversion == "half->float":
        x = _half(x)
        want = x
    elif conversion == "float->half":
        x[:3] = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 70000.0]     # ties both ways, overflow
        want = _half(x)
    else:
        x[:2] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]                # ties both ways
        want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(_vector("Cast", conversion, x), want)


def _tree_sum(x: np.ndarray, rnd) -> np.float32:
    """ReduceSum's documented order: adjacent pairs in each 256-byte repeat (zero lanes past
    the count), the repeats added in order, every addition rounded by ``rnd``."""
    lanes = 256 // x.itemsize
    total = None
    for r0 in range(0, x.size, lanes):
        part = np.zeros(lanes, np.float32)
        part[:min(lanes, x.size - r0)] = x[r0:r0 + lanes]
        while part.size > 1:
            part = rnd(part[0::2] + part[1::2])
        total = part[0] if total is None else rnd(np.float32(total + part[0]))
    return np.float32(total)


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("count", [1, 37, 64, 200, 513])
def test_vector_reduce_sum_adds_in_the_documented_order(count, dtype):
    """Operands of mixed binades, so that another order or rounding gives another sum."""
    x = _operands(dtype, n=count, seed=count, low=-60, high=60, ties=False)
    np_dtype = np.float16 if dtype == "half" else np.float32
    rnd = _half if dtype == "half" else (lambda v: np.asarray(v, np.float32))
    want = _tree_sum(x.astype(np_dtype), rnd)
    assert _vector("ReduceSum", dtype, x)[0] == want
    if count >= 64:  # the check can fail: in index order the sum differs
        sequential = np.float32(0)
        for value in x:
            sequential = rnd(np.float32(sequential + value))
        assert sequential != want


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_vector_reduce_max_and_duplicate(dtype):
    x = -np.abs(_operands(dtype, n=300, seed=6)) - 1     # every element negative
    x = _half(x) if dtype == "half" else x
    assert _vector("ReduceMax", dtype, x)[0] == x.max()
    x[123] = np.nan
    assert np.isnan(_vector("ReduceMax", dtype, x)[0])
    assert np.array_equal(_vector("Duplicate", dtype, np.zeros(77), scalar=-2.5),
                          np.full(77, -2.5, np.float32))



# The repeat/stride (level-0) forms the rewritten kernels use for whole tiles
# (ascend_kernels/kernels/pasa_vector_ops.h): pairs of 32-byte blocks, ReduceDataBlock,
# Brcb, Compares and Select.

def _blocks(x, dtype):
    return x.reshape(-1, 16 if dtype == "half" else 8)


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("op", ["PairAdd", "PairMax"])
def test_vector_level0_pairs_of_blocks(op, dtype):
    """Block i of the result is op(block 2i, block 2i + 1) of the operand (block stride 2,
    repeat stride 16), each lane rounded once (half: the pairs of 1 + k ulp tie)."""
    x = _operands(dtype, n=1024, seed=7)
    x[300] = np.nan
    pairs = _blocks(x, dtype).reshape(-1, 2, _blocks(x, dtype).shape[1])
    with np.errstate(invalid="ignore"):
        want = (np.add if op == "PairAdd" else np.maximum)(pairs[:, 0], pairs[:, 1]).reshape(-1)
    want = _half(want) if dtype == "half" else want
    got = _vector(op, dtype, x)
    assert np.array_equal(got, want, equal_nan=True), np.flatnonzero(got != want)[:5]


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("op", ["ReduceDataBlockSum", "ReduceDataBlockMax"])
def test_vector_reduce_data_block_in_the_documented_order(op, dtype):
    """One result per 32-byte block: a binary tree of adjacent pairs, each addition rounded to
    the type (the same tree as ReduceSum's within a block); the max propagates NaN."""
    x = _operands(dtype, n=1024, seed=8, low=-60, high=60, ties=False)
    x[77] = np.nan if op.endswith("Max") else x[77]
    np_dtype = np.float16 if dtype == "half" else np.float32
    rnd = _half if dtype == "half" else (lambda v: np.asarray(v, np.float32))
    blocks = _blocks(x, dtype)
    if op.endswith("Sum"):
        want = np.array([_tree_sum(b.astype(np_dtype), rnd) for b in blocks], np.float32)
        sequential = np.zeros(len(blocks), np.float32)
        for column in blocks.T:
            sequential = rnd(sequential + column)
        assert not np.array_equal(sequential, want)  # the check can fail: index order differs
    else:
        want = blocks.max(1)
    got = _vector(op, dtype, x)
    assert np.array_equal(got, want, equal_nan=True), np.flatnonzero(got != want)[:5]


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_vector_brcb_fills_one_block_per_element(dtype):
    x = _operands(dtype, n=256, seed=9)
    assert np.array_equal(_vector("Brcb", dtype, x), np.repeat(x, _blocks(x, dtype).shape[1]))


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_vector_compares_then_select(dtype):
    """Compares sets bit i where a[i] <cmp> scalar (ties included for LE and GE); Select takes
    the first tensor where the bit is set, else the second tensor or the scalar."""
    a, b = _operands(dtype, n=512, seed=10, low=-4, high=4), _operands(dtype, n=512, seed=11)
    s = float(a[17])
    a[100:110] = s  # ties with the scalar
    assert np.array_equal(_vector("SelectLE", dtype, a, b, scalar=s), np.where(a <= s, a, b))
    assert np.array_equal(_vector("SelectGE", dtype, a, b, scalar=s), np.where(a >= s, b, -2.5))


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_vector_compares_refuses_the_stale_mask_of_a_level0_call(dtype):
    """A level-0 Add with a partial mask leaves it in the register; the count-mode Compares
    after it would compare only those lanes of each repeat on the hardware (Huawei's
    implementation sets no mask): the emulation refuses it, and runs it after ResetMask."""
    a, b = _operands(dtype, n=1024, seed=3), _operands(dtype, n=1024, seed=4)
    with pytest.raises(RuntimeError, match="ResetMask"):
        _vector("ComparesAfterPartialMask", dtype, a, b, scalar=0.0)
    got = _vector("ComparesAfterResetMask", dtype, a, b, scalar=0.0)
    assert np.array_equal(got, np.where(a <= 0.0, a, b))
