"""The AscendC kernels of ascend_kernels/ run under the CPU emulation (backend "ascendc-emu"):
against the torch backend's same allocation at the same tiling, on the paper's overflow cases,
and what they refuse. Their host tiling, cost counters and the emulation's own checks:
test_ascendc_emu_internals.py."""
from __future__ import annotations

import math

import pytest
import torch

import pasa_npu

pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import ascendc_emu  # noqa: E402
from pasa_npu.tools.inputs import Case  # noqa: E402
from test_golden import CASES, kv_lens, make_case  # noqa: E402
from _paged import PAGED_CASES, paged_case  # noqa: E402
from _bounds import (ascendc_numerics, call_shift_gain, lse_bound, lse_scale,  # noqa: E402
                     out_bound)
from _support import SIM, sim_param  # noqa: E402

KERNEL_ALGORITHMS = ("fa-fp32", "pasa", "pasa-exact")


# --------------------------------------------------------------------------- support matrix


def kernels_support(case: dict, algorithm: str) -> bool:
    """What the kernels implement, written out independently of the backend's own check:
    BNSD/BSND/BSH tensors and packed TND/NTD batches, explicit masks and the bands of sparse
    modes 0-4, three allocations, any head dim of a dense K/V (one that is not a multiple of 16
    reaches them zero-padded; the matrix has no paged case)."""
    return algorithm in KERNEL_ALGORITHMS


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` at |x| (float64)."""
    mant = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]
    tiny = {torch.float16: 2.0 ** -14, torch.bfloat16: 2.0 ** -126, torch.float32: 2.0 ** -126}[dtype]
    return torch.exp2(torch.floor(torch.log2(x.double().abs().clamp_min(tiny))) - mant)


# Tolerance against the torch backend (measured maxima over this file's matrix in brackets:
# `python tests/ascend_kernels/test_ascendc_emu.py` prints them). Each bound below is taken
# together with tests/_bounds.py's derived bound for another implementation of the same
# allocation, the larger of the two: which fp32 sums run in another order depends on the CPU
# (torch's matmuls over Q K^T and P V sum in the cube's key order on some CPUs and not on
# others, and over another number of rows in another order), so which roundings flip does
# too; the derived bounds allow every rounding that can flip, on any CPU.
# Exact equality is impossible where the two compute a step in a different order or with a
# different elementary function, not where they round differently: every rounding step, the
# score and P'V matmuls (both accumulate in key order) and the online update order coincide.
# The kernels' fp32 row sums (fa-fp32's sum of P, pasa's sums of S' for the block mean and of
# P', pasa-exact's sum of P') are whole-tile trees: pairs of 32-byte blocks added element-wise
# until a row is one repeat (or one block), then ReduceDataBlock's documented binary tree; torch
# sums in its own vectorised order. fp32 sums of at most 256 terms in two orders differ by a few
# fp32 ulps, which the allocations either round away (pasa rounds each sum to fp16) or carry
# into l and LSE:
#  * output: each element within 2 units in the last place of its row's largest magnitude
#    [fa-fp32 1, pasa 0.06, pasa-exact 1]. A row is rescaled as a whole by a = exp(m - m'), so a
#    1-ulp difference in one fp32 exp (glibc expf in the emulation, SLEEF in torch; ~1% of
#    arguments) moves many elements of that row by one ulp of its scale. pasa keeps O in fp16:
#    each fold O = fp16(fp16(a O) + fp16(b P'V)) takes fp16 factors a and b, and one of them
#    rounding the other way moves the row by up to one ulp of its scale in that fold, so pasa's
#    bound is one ulp per kv block the row folds plus one for the final division;
#  * LSE (fp32): fa-fp32 within 4 ulp [2] (log and the order of the fp32 row sums) of the larger
#    of its two terms m and log l, which may cancel: |m| <= |LSE| + log(keys), so of
#    |LSE| + log(keys) (keys: the kv blocks' length);
#    pasa within one fp16 ulp of the LSE's magnitude [0.34 of it at the real shapes of
#    test_ascendc_emu_shapes, 0.02 here]: pasa's LSE is m + gamma F + log l from fp16 m, F and
#    l. One fp16 block mean rounding the other way moves F and m by an fp16 ulp each (at most
#    one of the LSE's, since m + gamma F <= LSE) and l absorbs the move up to its own fp16
#    rounding, 2^-11 relative per block, so a row's LSE moves by less than one fp16 ulp of the
#    LSE unless several such roundings add up in one direction;
#    pasa-exact within tests/_bounds.py's derived bound for an implementation of the allocation
#    against the torch backend (lse_bound: one fp16 ulp of the LSE's scale L and 2 u relative
#    of it) [5.9e-5 on test_ascendc_emu_shapes' gemma-256-gqa-ragged, 4.9e-3 allowed there]: its
#    fp16 S' and P' are rounded from fp32 values that the two compute in another order (the
#    score matmul, the block means of K), so a rounding may go the other way, by an ulp of S'
#    (moving the LSE by that key's share of the row's weight times the ulp) or of P'. Which
#    roundings flip depends on the CPU torch runs on;
#  * decode rows with one query per kv head: torch's GEMV does not accumulate in key order (the
#    cube does), so S itself differs in the last fp32 bit there; the bounds above still hold.
#    Where the kernels shift the scores (decode: ascendc_numerics in tests/_bounds.py), pasa and
#    pasa-exact round S' to fp16 from such fp32 scores and row sums, so an S' rounding may go the
#    other way (one fp16 ulp of that S'); the bounds above hold there too.
OUT_ULPS = 2
LSE_ULPS = 4
LSE_FP16_ULPS = {"pasa": 1}


def out_ulps(algorithm: str, kv_blocks: int) -> int:
    """The output bound in ulps of a row's scale for rows folding up to ``kv_blocks`` blocks."""
    return max(OUT_ULPS, kv_blocks + 1) if algorithm == "pasa" else OUT_ULPS


def assert_matches_torch(out, lse, ref, ref_lse, algorithm, dtype, kv_blocks: int = 1, *,
                         call: tuple | None = None, kv_lens=None, kv_block: int = 128):
    """The kernels' result against the torch backend's (comment above): each output element
    within the larger of out_ulps and tests/_bounds.py's derived out_bound, ulps of its row's
    scale; pasa's LSE, given the fused_attention ``call`` (q, k, v, keywords) and its rows'
    ``kv_lens`` in kv blocks of ``kv_block``, within the derived lse_bound with its shift
    term (both hold on any CPU), else within LSE_FP16_ULPS of each LSE."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN pattern differs from the torch backend"
    row_scale = ref.double().abs().amax(-1, keepdim=True).expand_as(ref)
    ulps = max(out_ulps(algorithm, kv_blocks), out_bound(algorithm, dtype, kv_blocks))
    excess = ((out.double() - ref.double()).abs() - ulps * _ulp(row_scale, dtype))
    excess = excess[~torch.isnan(ref)]
    assert float(excess.max()) <= 0, (
        f"{int((excess > 0).sum())} output elements differ from the torch backend by more than "
        f"{ulps} ulp of their row's scale")
    if lse is None:
        return
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "LSE -inf pattern differs from the torch backend"
    diff = (lse - ref_lse)[finite].double().abs()
    if algorithm in LSE_FP16_ULPS and call is None:
        bound = LSE_FP16_ULPS[algorithm] * _ulp(ref_lse[finite], torch.float16)
    elif algorithm in LSE_FP16_ULPS or algorithm == "pasa-exact":  # the derived bound
        scale = lse_scale(ref_lse)
        gain = 0.0 if call is None else call_shift_gain(algorithm, dtype, scale, call, kv_lens,
                                                        kv_block)
        bound = torch.full_like(diff, lse_bound(algorithm, scale, gain)
                                * float(_ulp(torch.tensor(scale), torch.float16)))
    else:
        terms = ref_lse[finite].double().abs() + math.log(kv_blocks * pasa_npu.DEFAULT_TILING.kv_block)
        bound = LSE_ULPS * _ulp(terms, torch.float32)
    assert bool((diff <= bound).all()), f"LSE differs by up to {float(diff.max()):.3g}"


def torch_reference(q, k, v, tiling: dict, **kw):
    """The torch backend's ``fused_attention(q, k, v, **kw)`` in the numerics of the kernels' call
    that the host tiled as ``tiling`` (``last_run_stats()["tiling"]``): shifting the scores where
    the kernels do, pasa's block means from the keys where they form K' (tests/_bounds.py,
    ascendc_numerics)."""
    with ascendc_numerics(tiling):
        return pasa_npu.fused_attention(q, k, v, backend="torch", **kw)


def emulated_cores(n: int):
    """The emulation with ``n`` AI Cores (the host tiles for them): the small cases of the
    matrix then give each core several tasks, as real shapes do at the real core count."""
    return ascendc_emu.using_model_parameters(dict(ascendc_emu.model_parameters(), core_num=n))


def run_on_few_cores(q, k, v, seed: int, **kw):
    """``fused_attention`` on ascendc-emu with 2 or 3 AI Cores (by ``seed``), or 1 where that
    still leaves a core with a single task; asserts that some core ran several tasks (units of
    split kv), each of several kv blocks where the case has them."""
    for cores in (2 + seed % 2, 1):
        with emulated_cores(cores):
            out, lse = pasa_npu.fused_attention(q, k, v, backend="ascendc-emu", **kw)
        tiling = ascendc_emu.last_run_stats()["tiling"]
        if tiling["num_tasks"] * tiling["kv_splits"] > tiling["block_dim"]:
            return out, lse
    assert tiling["num_tasks"] == 1, tiling
    return out, lse


@pytest.mark.parametrize("cores", ["model", "few"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("algorithm", pasa_npu.ALGORITHM_NAMES)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_backend(name, algorithm, dtype, cores):
    """Every case of the golden matrix: the kernels either compute it like the torch backend
    (same allocation, same tiling, part-filled last kv blocks included) or refuse it with
    NotImplementedError naming the feature. Unrepaired: an overflow repair must not hide a
    difference. ``model``: the model's AI Cores (at most one task each for these shapes);
    ``few``: 2 or 3 cores, so that every core walks several tasks, the schedule of real shapes."""
    case = CASES[name]
    q, k, v, kw = make_case(case, dtype)
    kw["repair_overflow"] = False
    if not kernels_support(case, algorithm):
        if cores == "model":
            with pytest.raises(NotImplementedError, match="ascendc-emu|ascendc_emu|not supported"):
                pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
        return
    if cores == "model":
        out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
    else:
        out, lse = run_on_few_cores(q, k, v, list(CASES).index(name), algorithm=algorithm, **kw)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    ref, ref_lse = torch_reference(q, k, v, tiling, algorithm=algorithm, **kw)
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, dtype, kv_blocks(case),
                         call=(q, k, v, kw), kv_lens=kv_lens(case),
                         kv_block=case.get("kv_block", pasa_npu.DEFAULT_TILING.kv_block))


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name", list(CASES))
def test_vector_chunks_change_no_bit(name, algorithm):
    """A vector core that works on its rows 16 at a time (``vec_chunk_rows``: the host's choice
    where a band's tiles do not fit its UB) computes every row as one working on all its rows at
    once does, bit for bit, with the row flags of a checked call; on 2-3 AI Cores, so that each
    walks several tasks. Its statistics and accumulator then hold several chunks' parts."""
    case = CASES[name]
    if not kernels_support(case, algorithm):
        pytest.skip("the kernels refuse this case (test_matches_torch_backend checks how)")
    q, k, v, kw = make_case(case, torch.float16)
    seed = list(CASES).index(name)
    results = []
    for chunk in (0, 16):
        with ascendc_emu.forcing_tiling(vec_chunk_rows=chunk):
            out, lse = run_on_few_cores(q, k, v, seed, algorithm=algorithm, **kw)
        tiling = ascendc_emu.last_run_stats()["tiling"]
        report = pasa_npu.overflow_report()
        flags = None if report.check is None else report.check.row_flags.clone()
        results.append((out, lse, flags, (report.checked, report.rows, report.tiles), tiling))
    whole, chunked = results
    assert whole[4]["vec_chunk_rows"] == whole[4]["vec_rows"], whole[4]
    assert chunked[4]["vec_chunk_rows"] == 16, chunked[4]
    assert torch.equal(whole[0].view(torch.int16), chunked[0].view(torch.int16))
    assert torch.equal(whole[1].view(torch.int32), chunked[1].view(torch.int32))
    assert (whole[2] is None) == (chunked[2] is None)
    assert whole[2] is None or torch.equal(whole[2], chunked[2])
    assert whole[3] == chunked[3]


@pytest.mark.parametrize("name", list(CASES))
def test_prob_sums_on_the_vector_cores_match_torch_backend(name):
    """pasa with the row sums of P' on the vector cores (``vector_prob_sums``: l and l' kept with
    its statistics, the P'V tile without the sums' columns) computes every case of the golden
    matrix like the torch backend, at this file's bounds, on 2-3 AI Cores; checked, it flags
    the rows the cube's sums flag. The numerics are the cube's (fp32 sums of the fp16 P',
    rounded to fp16 once), summed in another order."""
    case = CASES[name]
    q, k, v, kw = make_case(case, torch.float16)
    seed = list(CASES).index(name)
    unrepaired = dict(kw, repair_overflow=False)
    with ascendc_emu.forcing_tiling(vector_prob_sums=1):
        out, lse = run_on_few_cores(q, k, v, seed, algorithm="pasa", **unrepaired)
        tiling = ascendc_emu.last_run_stats()["tiling"]
        run_on_few_cores(q, k, v, seed, algorithm="pasa", **kw)
        on_vector = pasa_npu.overflow_report()
    run_on_few_cores(q, k, v, seed, algorithm="pasa", **kw)
    on_cube = pasa_npu.overflow_report()
    assert tiling["pv_cols"] == tiling["head_dim_v"], tiling
    ref, ref_lse = torch_reference(q, k, v, tiling, algorithm="pasa", **unrepaired)
    assert_matches_torch(out, lse, ref, ref_lse, "pasa", torch.float16, kv_blocks(case),
                         call=(q, k, v, unrepaired), kv_lens=kv_lens(case),
                         kv_block=case.get("kv_block", pasa_npu.DEFAULT_TILING.kv_block))
    assert (on_vector.checked, on_vector.rows, on_vector.tiles) == (on_cube.checked, on_cube.rows, on_cube.tiles)


@pytest.mark.parametrize("backend", ["ascendc-emu", sim_param(SIM)])
@pytest.mark.parametrize("case", ["prefill", "paged decode"])
def test_prob_sums_on_the_vector_cores_at_large_tiles_and_paged(backend, case):
    """pasa's row sums of P' on the vector cores where the cube takes a kv block in two key
    pieces and a vector core widens P' half a chunk's rows at a time (q_block 128, kv_block 256,
    d = 128, causal GQA 2:1, 700 rows, so that the last tile and kv block are part-filled; 2 AI
    Cores), and in paged decode, where the kernels shift the scores: against the torch backend
    at this file's bounds; also under Huawei's implementation of the AscendC API (ascendc-sim)."""
    from pasa_npu import ascendc_sim
    if case == "prefill":
        gen = torch.Generator().manual_seed(7)
        q = torch.randn(1, 4, 700, 128, generator=gen).half()
        k, v = (torch.randn(1, 2, 700, 128, generator=gen).half() for _ in range(2))
        kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", scale=128 ** -0.5, q_block=128,
                  kv_block=256, sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask(), repair_overflow=False)
        blocks = 3
    else:
        name = "decode-bsh-3d"  # blocks of 16 keys: several pages a kv block
        q, k, v, kw, _ = paged_case(PAGED_CASES[name], torch.float16)
        kw = dict(kw, repair_overflow=False)
        blocks = None
    with emulated_cores(2), ascendc_emu.forcing_tiling(vector_prob_sums=1):
        out, lse = pasa_npu.fused_attention(q, k, v, algorithm="pasa", backend=backend, **kw)
    tiling = (ascendc_emu if backend == "ascendc-emu" else ascendc_sim).last_run_stats()["tiling"]
    assert tiling["pv_cols"] == tiling["head_dim_v"], tiling
    if case == "prefill":
        assert tiling["cube_keys"] < tiling["kv_block"] and tiling["vec_sum_rows"] < tiling["vec_chunk_rows"], tiling
    else:
        assert tiling["shift_scores"], tiling
        blocks = -(-max(PAGED_CASES[name]["kv_lens"]) // tiling["kv_block"])
    ref, ref_lse = torch_reference(q, k, v, tiling, algorithm="pasa", **kw)
    assert_matches_torch(out, lse, ref, ref_lse, "pasa", torch.float16, blocks)


@pytest.mark.parametrize("backend", ["ascendc-emu", sim_param(SIM)])
@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("layout,mask", [("BNSD", "causal"), ("BSH", "explicit")])
def test_tiles_of_more_rows_than_a_cube_piece(algorithm, layout, mask, backend):
    """q_block 256 at d = 128: the cube multiplies each tile in pieces of 128 rows (L0A and L0C
    hold one) and each vector core works on its 128 rows in chunks; 300 query rows in tiles of
    256 and 44 with GQA 2:1, so that the last piece and chunk are part-filled, on 2 AI Cores.
    Against the torch backend at this file's bounds; also under Huawei's implementation of the
    AscendC API (ascendc-sim)."""
    from pasa_npu import ascendc_sim
    gen = torch.Generator().manual_seed(5)
    b, nq, nkv, s, d = 1, 4, 2, 300, 128
    shape = (b, nq, s, d) if layout == "BNSD" else (b, s, nq * d)
    kv_shape = (b, nkv, s, d) if layout == "BNSD" else (b, s, nkv * d)
    q = torch.randn(shape, generator=gen).half()
    k, v = (torch.randn(kv_shape, generator=gen).half() for _ in range(2))
    kw = dict(num_heads=nq, num_key_value_heads=nkv, input_layout=layout, scale=d ** -0.5, q_block=256,
              repair_overflow=False)
    if mask == "causal":
        kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    else:
        kw.update(atten_mask=torch.rand(s, s, generator=gen) < 0.3)
    with emulated_cores(2):
        out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend=backend, **kw)
    tiling = (ascendc_emu if backend == "ascendc-emu" else ascendc_sim).last_run_stats()["tiling"]
    assert tiling["q_tile"] == 256 and tiling["cube_rows"] == 128, tiling
    assert tiling["vec_rows"] == 128 and tiling["vec_chunk_rows"] < 128, tiling
    assert tiling["num_tasks"] > tiling["block_dim"], tiling
    ref, ref_lse = torch_reference(q, k, v, tiling, algorithm=algorithm, **kw)
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16, -(-s // 128))


def kv_blocks(case: dict) -> int:
    """The most kv blocks a row of a test_golden case folds (default 128-key blocks)."""
    keys = case["S2"] if "S2" in case else max(b - a for a, b in zip([0] + case["kv_cum"], case["kv_cum"]))
    return -(-keys // case.get("kv_block", pasa_npu.DEFAULT_TILING.kv_block))


@pytest.mark.parametrize("algorithm", ("pasa", "pasa-exact"))
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_matches_torch_backend(name, algorithm):
    """Paged KV, whose last kv blocks are part-filled here, against the torch backend,
    unrepaired. Decode with blocks of 16 keys spans several physical blocks per kv block: the
    kernels shift its scores (no K' per physical block), so pasa-exact runs it too."""
    q, k_cache, v_cache, kw, _ = paged_case(PAGED_CASES[name], torch.float16)
    kw = dict(kw, repair_overflow=False)
    out, lse = pasa_npu.fused_attention(q, k_cache, v_cache, algorithm=algorithm, backend="ascendc-emu", **kw)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    ref, ref_lse = torch_reference(q, k_cache, v_cache, tiling, algorithm=algorithm, **kw)
    lens = PAGED_CASES[name]["kv_lens"]
    bounds = dict(call=(q, k_cache, v_cache, kw), kv_lens=lens, kv_block=tiling["kv_block"])
    blocks = -(-max(lens) // tiling["kv_block"])
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16, blocks, **bounds)
    out, lse = run_on_few_cores(q, k_cache, v_cache, list(PAGED_CASES).index(name), algorithm=algorithm, **kw)
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16, blocks, **bounds)


# --------------------------------------------------------------------------- paper cases


PAPER_CASES = [Case("uniform", 30, 0.5), Case("hybrid", 30, 10), Case("uniform", 20, 20),
               Case("resonance", 0, 1e5)]


@pytest.mark.parametrize("case", PAPER_CASES, ids=[c.label for c in PAPER_CASES])
def test_paper_overflow_cases(case):
    """The paper's overflow cases (fa-fp16s: 100% or partly NaN) at one head of (1280, 128):
    the kernels' PASA allocations stay finite, as accurate as the torch backend's. Not held
    to the torch backend in ulps: at these scores a score's fp32 rounding moves its weight
    visibly, and which of the two implementations' fp32 sums run in another order depends
    on the CPU torch runs on."""
    q, k, v = case.make((1, 1, 1280, 128), seed=0)
    kw = dict(num_heads=1, input_layout="BNSD", scale=128 ** -0.5)
    gold, _ = pasa_npu.reference_attention(q, k, v, **kw)
    fp16s, _ = pasa_npu.fused_attention(q, k, v, algorithm="fa-fp16s", backend="torch", **kw)
    assert not torch.isfinite(fp16s).all()  # the case overflows plain fp16 scores
    for algorithm in ("pasa", "pasa-exact"):
        out, _ = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
        ref, _ = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="torch", **kw)
        assert torch.isfinite(out).all(), f"{algorithm} overflowed"
        err = float((out.double() - gold).norm() / gold.norm())
        ref_err = float((ref.double() - gold).norm() / gold.norm())
        assert err <= 1.02 * ref_err + 1e-6, f"{algorithm}: {err:.3g} vs torch backend {ref_err:.3g}"


# --------------------------------------------------------------------------- refusals


def _small(d=32, s=40, dtype=torch.float16):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(1, 2, s, d, generator=gen).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("kwargs,feature", [
    (dict(algorithm="fa-fp16s"), "algorithm in"),
    (dict(algorithm="pasa-mixed"), "algorithm in"),
    (dict(algorithm="pasa", atten_mask=torch.zeros(40, 40, dtype=torch.bool), kv_block=16),
     "explicit atten_mask needs kv_block >= 32"),
    (dict(algorithm="pasa-exact", rounding_guard=True), "rounding_guard"),
    (dict(algorithm="pasa", kv_block=48), "kv_block must be a power of two"),
    (dict(algorithm="fa-fp32", q_block=5000), r"q_block must lie in \[1, 4095\]"),
    (dict(algorithm="pasa-exact", q_block=2048), "L1 needs"),
])
def test_unsupported_features_are_refused(kwargs, feature):
    kwargs = dict(kwargs)
    q, k, v = _small(d=kwargs.pop("d", 32), s=kwargs["q_block"] + 52 if kwargs.get("q_block") else 40)
    with pytest.raises(NotImplementedError, match=feature):
        pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD", backend="ascendc-emu",
                                 **kwargs)


def measured_maxima() -> dict:
    """Per kernel allocation, the largest deviations from the torch backend over the golden
    matrix: output in ulps of the row's scale, LSE absolute and in fp32 ulps."""
    worst = {}
    for dtype in (torch.float16, torch.bfloat16):
        for algorithm in KERNEL_ALGORITHMS:
            for case in CASES.values():
                if not kernels_support(case, algorithm):
                    continue
                q, k, v, kw = make_case(case, dtype)
                try:
                    out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
                except NotImplementedError:  # bf16 inputs are fa-fp32's only
                    continue
                tiling = ascendc_emu.last_run_stats()["tiling"]
                ref, ref_lse = torch_reference(q, k, v, tiling, algorithm=algorithm, **kw)
                row_scale = ref.double().abs().amax(-1, keepdim=True).expand_as(ref)
                keep = ~torch.isnan(ref)
                ulps = ((out.double() - ref.double()).abs() / _ulp(row_scale, dtype))[keep]
                w = worst.setdefault(algorithm, {"out_ulps": 0.0, "lse_abs": 0.0, "lse_ulps": 0.0})
                w["out_ulps"] = max(w["out_ulps"], float(ulps.max()) if ulps.numel() else 0.0)
                finite = torch.isfinite(ref_lse)
                if lse is not None and finite.any():
                    diff = (lse - ref_lse)[finite].double().abs()
                    w["lse_abs"] = max(w["lse_abs"], float(diff.max()))
                    w["lse_ulps"] = max(w["lse_ulps"], float((diff / _ulp(ref_lse[finite], torch.float32)).max()))
    return worst


if __name__ == "__main__":
    for name, w in measured_maxima().items():
        print(f"{name:11s} output {w['out_ulps']:.2f} ulp of the row scale, "
              f"LSE {w['lse_abs']:.2e} absolute ({w['lse_ulps']:.1f} fp32 ulp)")
