"""The AscendC kernels at shapes people run, on the model's AI Cores (backend "ascendc-emu"):
more tasks than cores, many kv blocks per task, ragged and packed batches, paged KV, decode
split across cores. Each against the torch backend's same allocation at test_ascendc_emu's
bounds, and against the fp64 golden; the tiling is checked to reach the schedule named.
Backend "ascendc-sim" runs the shapes it computes in seconds (SIM_SHAPES and the few-core
tests: the schedules above, part-filled last kv blocks included); a prefill shape here takes
it 15-30 s per allocation."""
from __future__ import annotations

import contextlib
import random

import pytest
import torch

import pasa_npu

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import ascendc_emu, ascendc_sim  # noqa: E402
from _support import SIM, TPIPE_L1_BYTES, sim_param  # noqa: E402
from test_ascendc_emu import KERNEL_ALGORITHMS, assert_matches_torch, kv_blocks, torch_reference  # noqa: E402
from _real_shapes import PREFILL_SHAPES  # noqa: E402
from _bounds import ascendc_numerics  # noqa: E402
from test_golden import kv_lens, make_case  # noqa: E402

SHAPES = {
    **PREFILL_SHAPES,  # on 24 cores: more (head, query tile) tasks than cores
    # decode of a batch whose tasks outnumber the cores, ragged contexts
    "decode-batch-gqa": dict(layout="BSH", B=8, Nq=32, Nkv=8, S1=1, S2=2048, D=128,
                             kv_lens=[2048, 1500, 77, 1024, 900, 2000, 129, 640]),
    # decode whose tasks are fewer than the cores: kv split across cores, merged by LSE
    "decode-split-kv": dict(layout="BSH", B=2, Nq=32, Nkv=4, S1=1, S2=8192, D=128,
                            kv_lens=[8192, 5000]),
}
#: the shapes ascendc-sim runs too: more tasks than cores with part-filled last kv blocks, and
#: kv split across cores
SIM_SHAPES = ("decode-batch-gqa", "decode-split-kv")
#: the longest contraction the torch backend's CPU matmuls sum in key order, as the cube does
#: (MKL's fp32 GEMM on AVX2 blocks a contraction of 256; 128 is the default kv block)
KEY_ORDER_KEYS = 128
MODULES = {"ascendc-emu": ascendc_emu, SIM: ascendc_sim}
BOTH = ["ascendc-emu", sim_param(SIM)]


def run_kernels(q, k, v, backend: str, **kw):
    """``fused_attention`` on ``backend`` and the host's tiling of the call."""
    out, lse = pasa_npu.fused_attention(q, k, v, backend=backend, **kw)
    return out, lse, MODULES[backend].last_run_stats()["tiling"]


def check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling: dict, case: dict):
    """The torch backend's bounds (test_ascendc_emu.assert_matches_torch), in the numerics of the
    call's ``tiling`` (test_ascendc_emu.torch_reference). pasa is held against the fp64 golden
    instead (relative RMSE and largest LSE error each within 1.1x the torch backend's) where the
    two cannot round alike: with split kv it restarts its fp16 statistics per range, and over
    blocks of more than KEY_ORDER_KEYS keys the torch backend's CPU matmuls (M^T K, P'V) do not
    accumulate in key order as the cube does, so its fp16 roundings of K' and P'V go the other
    way now and then, in every fold. Every allocation's relative RMSE against the golden stays
    within 1.1x the torch backend's."""
    split = tiling["kv_splits"] > 1 or tiling["kv_block"] > KEY_ORDER_KEYS
    ref, ref_lse = torch_reference(q, k, v, tiling, algorithm=algorithm, **kw)
    golden_kw = {n: a for n, a in kw.items() if n not in ("repair_overflow", "q_block", "kv_block")}
    gold, gold_lse = pasa_npu.reference_attention(q, k, v, **golden_kw)
    err = float((out.double() - gold).norm() / gold.norm())
    ref_err = float((ref.double() - gold).norm() / gold.norm())
    assert torch.isfinite(out).all()
    assert err <= 1.1 * ref_err, f"{algorithm}: relative RMSE {err:.3g}, torch backend {ref_err:.3g}"
    if split and algorithm == "pasa":
        lse_err = float((lse.double() - gold_lse).abs().max())
        ref_lse_err = float((ref_lse.double() - gold_lse).abs().max())
        assert lse_err <= 1.1 * ref_lse_err, (lse_err, ref_lse_err)
        return
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16, kv_blocks(case),
                         call=(q, k, v, kw), kv_lens=kv_lens(case), kv_block=tiling["kv_block"])


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name,backend", [(name, "ascendc-emu") for name in SHAPES]
                         + [sim_param(name, SIM) for name in SIM_SHAPES])
def test_real_shape_matches_torch_and_golden(name, backend, algorithm):
    q, k, v, kw = make_case(SHAPES[name], torch.float16)
    kw["repair_overflow"] = False
    out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert tiling["block_dim"] == ascendc_emu.model_parameters()["core_num"]
    split = name == "decode-split-kv"
    if split:
        assert tiling["kv_splits"] > 1 and tiling["num_tasks"] < tiling["block_dim"], tiling
    else:
        assert tiling["num_tasks"] > tiling["block_dim"], tiling
    assert tiling["num_kv_blocks"] > 4, tiling
    if algorithm != "fa-fp32" and not tiling["shift_scores"]:  # K' made in this launch, before SyncAll
        assert tiling["prep_in_attention"], tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, SHAPES[name])


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
def test_paged_batch_at_real_shape(algorithm):
    """A paged decode-and-prefill batch at a serving shape: 8 kv heads of 128 in blocks of 128
    keys read through a shuffled block table, 48 tasks on the model's cores."""
    from _paged_problems import dense_problem, paged_problem
    from pasa_npu import backends
    case = dict(layout="BNSD", B=4, Nq=32, Nkv=8, S1=96, S2=1536, D=128,
                kv_lens=[1536, 700, 1200, 333], sparse_mode=3, mask="optimized")
    q, k, v, kw = make_case(case, torch.float16)
    dense = dense_problem(q, k, v, algorithm=algorithm, **kw)
    paged, reference = paged_problem(dense, 128, "BNSD", shared_prefix=1)
    ascendc_emu.run(paged)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    assert tiling["num_tasks"] > tiling["block_dim"], tiling
    with ascendc_numerics(tiling):
        backends.BACKENDS["torch"].runner()(reference)
    assert_matches_torch(paged.out, paged.lse, reference.out, reference.lse, algorithm, torch.float16, 12,
                         call=(q, k, v, kw), kv_lens=kv_lens(case), kv_block=tiling["kv_block"])


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
def test_decode_split_with_several_units_per_core(algorithm, backend):
    """Split kv where the (task, split) units outnumber the cores: 2 tasks of 24 kv blocks in 3
    ranges each on 3 emulated AI Cores, two units a core, merged by their LSE."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BSH", B=1, Nq=16, Nkv=2, S1=1, S2=3072, D=128)
    q, k, v, kw = make_case(case, torch.float16)
    with emulated_cores(3):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert tiling["kv_splits"] > 1 and tiling["num_tasks"] * tiling["kv_splits"] > tiling["block_dim"], tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


#: q_block 512: a vector core holds 256 rows of a tile, more than one instruction on its rows'
#: statistics covers (PASA_MAX_CHUNK_ROWS, 128); at d = 16 and 16- or 64-key blocks its UB would
#: hold all 256 at once. "split": one query tile per head against a long context, which the host
#: would split across cores if the merge could take the tile's rows.
WIDE_TILES = {
    "prefill": dict(layout="BNSD", B=1, Nq=2, Nkv=2, S1=600, S2=300, D=16, q_block=512, kv_block=16),
    "split": dict(layout="BNSD", B=1, Nq=1, Nkv=1, S1=500, S2=8192, D=16, q_block=512, kv_block=64),
}


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name", list(WIDE_TILES))
def test_tiles_of_more_rows_than_one_instruction_covers(name, algorithm):
    """The host works on such a band in chunks of 128 rows and keeps such a call's kv whole (with
    256-row chunks the statistics' instructions were refused or dropped rows, and the merge of a
    split returned wrong rows)."""
    case = WIDE_TILES[name]
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    out, lse, tiling = run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)
    assert tiling["vec_rows"] == 256 and tiling["vec_chunk_rows"] == 128, tiling
    assert tiling["vec_stat_rows"] == 128, tiling
    if name == "split":
        cores = ascendc_emu.model_parameters()["core_num"]
        assert tiling["num_tasks"] < cores and tiling["kv_splits"] == 1, tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)
    # two statistics groups of 128 rows, each gathered from four 32-row chunks: bit for bit
    with ascendc_emu.forcing_tiling(vec_chunk_rows=32):
        out32, lse32, tiling32 = run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)
    assert (tiling32["vec_chunk_rows"], tiling32["vec_stat_rows"]) == (32, 128), tiling32
    assert torch.equal(out.view(torch.int16), out32.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), lse32.view(torch.int32))


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("q_block,kv_block", [(16, 256), (48, 256), (128, 256), (192, 32), (512, 256), (512, 16)])
def test_tilings_a_caller_may_set(q_block, kv_block, algorithm):
    """q_block and kv_block away from the default on a causal ragged batch over 3 AI Cores: 256-key
    blocks, whose fp32 row reductions fill two levels of their tree (the host once sized it for
    one), 16- and 48-row tiles, 256-row vector bands."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BSND", B=2, Nq=4, Nkv=2, S1=300, S2=700, D=64, sparse_mode=3, mask="optimized",
                kv_lens=[700, 333], q_block=q_block, kv_block=kv_block)
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(3):
        out, lse, tiling = run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)
    assert tiling["kv_block"] == kv_block and tiling["q_tile"] == min(q_block, 300), tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


@pytest.mark.parametrize("backend", BOTH)
def test_pasa_shifts_256_key_blocks_with_its_matrix_in_pieces(backend):
    """kv_block 256 at d = 128: M^T (256 x 256 fp16) does not fit L0A, so the key preprocessing
    multiplies it a piece of its rows at a time (the tiling's shift_rows); a ragged batch, so that
    a part-filled last block takes that path, its column sums' row of ones in a piece's buffer,
    and the vector cores' correction of its keys."""
    case = dict(layout="BNSD", B=2, Nq=2, Nkv=1, S1=64, S2=600, D=128, kv_lens=[600, 256])
    q, k, v, kw = make_case(case, torch.float16)
    kw.update(kv_block=256, repair_overflow=False)
    out, lse, tiling = run_kernels(q, k, v, backend, algorithm="pasa", **kw)
    assert tiling["kv_block"] == 256 and tiling["shift_rows"] < 256 and tiling["prep_dim"] > 0, tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, "pasa", tiling, case)


def test_a_checked_call_whose_repair_pass_does_not_fit_is_refused_when_planned():
    """pasa at D = 512 fits the vector cores' UB at 32-key blocks where the fa-fp32 repair pass of
    the overflow check does not: the call is refused as it is planned, naming the pass (it raised
    a ValueError at launch), and runs with the check off."""
    case = dict(layout="BNSD", B=1, Nq=2, Nkv=2, S1=200, S2=300, D=512, kv_block=32)
    q, k, v, kw = make_case(case, torch.float16)
    with pytest.raises(NotImplementedError, match="the overflow check's fa-fp32 repair pass: attention UB"):
        pasa_npu.fused_attention(q, k, v, algorithm="pasa", backend="ascendc-emu", **kw)
    kw["repair_overflow"] = False
    out, lse, tiling = run_kernels(q, k, v, "ascendc-emu", algorithm="pasa", **kw)
    check_against_torch_and_golden(out, lse, q, k, v, kw, "pasa", tiling, case)


#: head dims wider than L0B holds of a 128-key block (128 columns): DeepSeek-V2/V3's prefill heads
#: (192 for Q and K, 128 for V) and Gemma's 256, at the default 128-key blocks. Each with more tasks
#: than cores and a part-filled last kv block; "decode": split across cores; "paged": K' (and
#: pasa-exact's means) per physical block.
WIDE_HEADS = {
    "deepseek-192/128-causal": dict(layout="BSND", B=1, Nq=16, Nkv=16, S1=700, S2=700, D=192, Dv=128,
                                    sparse_mode=3, mask="optimized"),
    "gemma-256-gqa-ragged": dict(layout="BSH", B=2, Nq=8, Nkv=4, S1=300, S2=900, D=256, kv_lens=[900, 333]),
    "gemma-256-decode": dict(layout="BNSD", B=1, Nq=8, Nkv=2, S1=1, S2=4000, D=256),
    # small enough for ascendc-sim, on 2 cores
    "small-192/128": dict(layout="BSND", B=1, Nq=4, Nkv=2, S1=150, S2=300, D=192, Dv=128),
}
WIDE_HEAD_CUBE_COLS = {"deepseek-192/128-causal": 128, "gemma-256-gqa-ragged": 128, "gemma-256-decode": 128,
                       "small-192/128": 128}


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name,backend", [(name, "ascendc-emu") for name in WIDE_HEADS]
                         + [sim_param(name, SIM) for name in ("gemma-256-decode", "small-192/128")])
def test_head_dims_wider_than_the_cube_holds(name, backend, algorithm):
    """The cube cuts K and V into pieces of the columns L0B holds: the score Mmads accumulate
    over the pieces of their contraction (in the order of the whole one, so the numerics are
    unchanged), P'V and the key preprocessing produce their columns piece by piece. Such heads
    were refused at the default kv_block; also under Huawei's implementation of the API."""
    case = WIDE_HEADS[name]
    from test_ascendc_emu import emulated_cores
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(2) if name.startswith("small") else contextlib.nullcontext():
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert tiling["cube_cols"] == WIDE_HEAD_CUBE_COLS[name] < case["D"], tiling
    if name.endswith("decode"):
        assert tiling["kv_splits"] > 1, tiling
    else:
        assert tiling["num_tasks"] > tiling["block_dim"], tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


#: 256-key blocks at d = 128: a K or V block (64 KiB) is twice an L0B buffer, so the cube holds
#: 128 keys of it (every column) at a time; 256-row tiles are multiplied in two pieces of 128 rows.
#: More tasks than cores, a causal mask and a part-filled last kv block; "small" for ascendc-sim.
KEY_PIECES = {
    "causal-gqa": dict(layout="BNSD", B=1, Nq=8, Nkv=2, S1=500, S2=1000, D=128, kv_block=256, q_block=256,
                       sparse_mode=3, mask="optimized"),
    "small": dict(layout="BSND", B=1, Nq=2, Nkv=1, S1=300, S2=300, D=128, kv_block=256, q_block=256),
    # K's rows 512 elements apart: fa-fp32 copies each 128-key piece of its raw keys on its own (two
    # pieces are 128 x 512 elements apart, past the DMA's 16-bit stride); part-filled last blocks
    "wide-rows-ragged": dict(layout="BSND", B=2, Nq=8, Nkv=4, S1=300, S2=700, D=128, kv_lens=[700, 333],
                             kv_block=256, q_block=256),
    # rows 4096 elements apart: Q, V and the key preprocessing's K take NZ, not Zz (16 rows of them
    # are past the DMA's 16-bit stride)
    "nz-rows": dict(layout="BSND", B=1, Nq=32, Nkv=32, S1=300, S2=300, D=128, kv_block=256, q_block=256),
}


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name,backend", [(name, "ascendc-emu") for name in KEY_PIECES]
                         + [sim_param("small", SIM)])
def test_blocks_larger_than_l0b_are_held_a_piece_of_keys_at_a_time(name, backend, algorithm):
    """The score tile is produced a piece of 128 keys (its columns) at a time, each key piece in
    L0B for both pieces of rows, and P'V accumulates over the key pieces of its contraction in L0C
    in key order (the numerics of one Mmad over the block); also under Huawei's implementation of
    the API."""
    case = KEY_PIECES[name]
    from test_ascendc_emu import emulated_cores
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(2 if name == "small" else 8):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert (tiling["cube_keys"], tiling["cube_cols"], tiling["kv_block"]) == (128, 128, 256), tiling
    assert tiling["cube_rows"] == 128 < tiling["q_tile"] and tiling["num_tasks"] > tiling["block_dim"], tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


#: paged caches at 256-key blocks and d = 128 (K in L1 as two NZ pieces of 128 keys): "decode",
#: blocks of 16 keys, whose runs of rows each fill part of a piece and whose scores the kernels shift
#: (the rows of a part-filled kv block past its keys zeroed piece by piece); "prefill", blocks of
#: 512 keys (K' is kept per physical block, which a kv block must divide), both pieces in one copy.
PAGED_KEY_PIECES = {
    "decode": dict(layout="BNSD", cache="4d", Nq=8, Nkv=2, D=128, block_size=16, q_lens=[1, 1],
                   kv_lens=[600, 150], share=[1]),
    "prefill": dict(layout="BSND", cache="3d", Nq=4, Nkv=2, D=128, block_size=512, q_lens=[300, 40],
                    kv_lens=[600, 170], share=[1], sparse_mode=3),
}


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name", list(PAGED_KEY_PIECES))
def test_paged_blocks_larger_than_l0b_are_held_a_piece_of_keys_at_a_time(name, algorithm):
    """Paged K and V at 256-key blocks, d = 128: each kv block is gathered from its physical
    blocks into the pieces of 128 keys the cube multiplies."""
    from _paged import paged_case
    from test_ascendc_emu import emulated_cores
    case = PAGED_KEY_PIECES[name]
    q, k_cache, v_cache, kw, _ = paged_case(case, torch.float16)
    kw.update(kv_block=256, repair_overflow=False)
    with emulated_cores(4):
        out, lse, tiling = run_kernels(q, k_cache, v_cache, "ascendc-emu", algorithm=algorithm, **kw)
    assert (tiling["cube_keys"], tiling["kv_block"]) == (128, 256), tiling
    check_against_torch_and_golden(out, lse, q, k_cache, v_cache, kw, algorithm, tiling,
                                   dict(S2=max(case["kv_lens"]), kv_lens=case["kv_lens"], kv_block=256))


@pytest.mark.parametrize("backend", ["ascendc-emu", sim_param(SIM)])
def test_pasa_exact_takes_one_query_buffer_where_two_do_not_fit_l1(backend):
    """pasa-exact at 256 x 256 tiles, d = 128, over 33 kv blocks: two Q buffers (64 KiB each) do
    not fit L1 beside K', V, P' and the block means, so the cube holds one, and each task's Q
    loads once the previous task's is scored; two tasks on each of two AI Cores; also under
    Huawei's implementation of the API."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BNSD", B=1, Nq=2, Nkv=1, S1=300, S2=8300, D=128, kv_block=256, q_block=256)
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(2):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm="pasa-exact", **kw)
    assert tiling["query_buffers"] == 1 and tiling["bytes_per_core"]["l1"] <= TPIPE_L1_BYTES, tiling
    assert tiling["num_tasks"] == 4 and tiling["block_dim"] == 2, tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, "pasa-exact", tiling, case)


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("algorithm,s1,cube_keys,key_buffer_keys", [
    ("fa-fp32", 300, 64, 64), ("pasa-exact", 300, 64, 64), ("pasa", 300, 128, 128), ("pasa", 1, 128, 128),
    ("pasa", 300, 64, 64), ("pasa", 300, 32, 64), ("pasa", 1, 32, 64)])
def test_key_blocks_land_in_l1_a_part_at_a_time(backend, algorithm, s1, cube_keys, key_buffer_keys):
    """A key buffer that holds a part of its block (``key_buffer_keys``, what a block too large for
    L1 needs): 256-key blocks at d = 128 multiplied ``cube_keys`` keys at a time, a part in each key
    buffer; the first two parts come with the operands queued ahead of the score tile, the others
    (four parts of 64 keys) land in the buffers the multiplied ones left. pasa in 4 or 8 key pieces
    (more than L0A keeps for its row sums of P') sums each piece with its P'V. A ragged batch (a
    part-filled last block, parts without keys) on two AI Cores, prefill and decode (pasa shifting
    its scores, the keys past a block's end zero in L1); also under Huawei's implementation of
    the API."""
    tiling = _run_in_forced_parts(backend, algorithm, s1, cube_keys=cube_keys, key_buffer_keys=key_buffer_keys)
    assert (tiling["cube_keys"], tiling["key_buffer_keys"]) == (cube_keys, key_buffer_keys), tiling
    assert tiling["shift_scores"] == (s1 == 1 and algorithm != "fa-fp32"), tiling


def _run_in_forced_parts(backend, algorithm, s1, **forced) -> dict:
    """A ragged batch of 256-key blocks at d = 128 and 256-row tiles (S1 = 300 or 1) on two AI
    Cores with the host's tiling choices ``forced``, checked against the torch backend and the
    golden; returns the tiling."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BNSD", B=2, Nq=2, Nkv=1, S1=s1, S2=1000, D=128, kv_lens=[1000, 300], kv_block=256,
                q_block=256)
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(2), ascendc_emu.forcing_tiling(**forced):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)
    return tiling


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("algorithm,s1,cube_keys,prob_buffer_keys", [
    ("fa-fp32", 300, 64, 64), ("pasa-exact", 300, 64, 128), ("pasa", 300, 64, 64), ("pasa", 300, 128, 128),
    ("pasa", 1, 32, 64)])
def test_prob_lands_in_l1_a_part_at_a_time(backend, algorithm, s1, cube_keys, prob_buffer_keys):
    """P' in parts of ``prob_buffer_keys`` keys of one piece of the cube's rows (what a block too large
    for L1 needs), two P' buffers: the first two parts come with the operands queued ahead of the
    P'V, the others land in the buffers the multiplied ones left, row piece by row piece. 256-key
    blocks at d = 128 and 256-row tiles (two pieces of 128 rows; the second task's 44 rows one),
    a ragged batch on two AI Cores, prefill and decode; also under Huawei's implementation of
    the API."""
    tiling = _run_in_forced_parts(backend, algorithm, s1, cube_keys=cube_keys, prob_buffer_keys=prob_buffer_keys)
    assert (tiling["cube_keys"], tiling["prob_buffer_keys"], tiling["prob_buffers"]) == (cube_keys, prob_buffer_keys, 2)
    assert tiling["cube_rows"] == (128 if s1 > 1 else 16), tiling
    assert tiling["bytes_per_core"]["l1"] <= TPIPE_L1_BYTES, tiling


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("algorithm,s1,kv_block,value_buffers", [
    ("fa-fp32", 300, 512, 2), ("fa-fp32", 1, 1024, 1), ("pasa", 300, 512, 2), ("pasa", 300, 1024, 1),
    ("pasa-exact", 300, 512, 2), ("pasa", 1, 512, 2), ("pasa-exact", 1, 512, 2)])
def test_kv_blocks_larger_than_l1_holds_whole(backend, algorithm, s1, kv_block, value_buffers):
    """Blocks of 512 and 1024 keys at d = 128, which L1 does not hold whole beside the other
    buffers: the host takes K' and P' in parts of 128 keys, and V in one buffer where two do not
    fit (its next block then lands during the score tile after each P'V); pasa's row sums of P'
    accumulate with each of a block's key pieces, and its key preprocessing takes each piece of
    M^T's rows from a band in L1 (M^T is 512 KiB at 512 keys), stages one key block at a time at
    1024 keys, and finishes a part-filled block's K' a piece of rows at a time, as pasa-exact's
    centres every block's keys. Prefill (256-row
    tiles) and decode (the shifted scores), a ragged batch with a part-filled last block on two
    AI Cores; also under Huawei's implementation of the API."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BNSD", B=2, Nq=2, Nkv=1, S1=s1, S2=2600, D=128, kv_lens=[2600, 700], kv_block=kv_block,
                q_block=256)
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(2):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert (tiling["kv_block"], tiling["key_buffer_keys"], tiling["prob_buffer_keys"]) == (kv_block, 128, 128), tiling
    assert tiling["value_buffers"] == value_buffers and tiling["bytes_per_core"]["l1"] <= TPIPE_L1_BYTES, tiling
    if algorithm != "fa-fp32" and s1 > 1:
        assert tiling["prep_vec_rows"] == 128 and tiling["bytes_per_core"]["prep_l1"] <= TPIPE_L1_BYTES, tiling
        assert tiling["prep_key_buffers"] == (2 if kv_block == 512 else 1), tiling
        assert tiling["shift_window"] == (algorithm == "pasa"), tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


@pytest.mark.parametrize("algorithm,s1,kv_block,named", [
    ("pasa-exact", 300, 1024, "attention UB"), ("fa-fp32", 300, 1024, "attention UB"),
    ("pasa", 1, 1024, "attention UB"), ("fa-fp32", 300, 2048, "kv_block must be a power of two in")])
def test_kv_blocks_the_buffers_do_not_hold(algorithm, s1, kv_block, named):
    """A kv block whose buffers an AI Core does not hold (the vector cores' score rows of 1024 keys:
    fa-fp32's and pasa-exact's in fp32, those of decode's shifted scores, with their statistics),
    or past 1024 keys, is refused by name."""
    case = dict(layout="BNSD", B=1, Nq=1, Nkv=1, S1=s1, S2=2600, D=128, kv_block=kv_block, q_block=128)
    q, k, v, kw = make_case(case, torch.float16)
    with pytest.raises(NotImplementedError, match=named):
        run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)


@pytest.mark.parametrize("algorithm,d,forced,named", [
    ("fa-fp32", 128, dict(key_buffer_keys=96), "keyBufferKeys"),
    ("fa-fp32", 128, dict(cube_keys=64, key_buffer_keys=96), "keyBufferKeys"),
    ("fa-fp32", 128, dict(cube_keys=24), "cubeKeys"), ("fa-fp32", 128, dict(cube_keys=512), "cubeKeys"),
    ("pasa", 256, dict(cube_keys=64), r"cubeKeys \(64\) keys of headDimV \+ 16 \(272\)"),
    ("fa-fp32", 128, dict(cube_keys=64, prob_buffer_keys=96), "probBufferKeys"),
    ("fa-fp32", 128, dict(prob_buffer_keys=64), "probBufferKeys")])
def test_key_parts_the_host_refuses(algorithm, d, forced, named):
    """A key part or piece that does not divide the block, or does not fit L0B (pasa: with the
    ones of its row sums of P', in more than two pieces), is refused by name."""
    case = dict(layout="BNSD", B=1, Nq=1, Nkv=1, S1=64, S2=600, D=d, kv_block=256, q_block=128)
    q, k, v, kw = make_case(case, torch.float16)
    with ascendc_emu.forcing_tiling(**forced), pytest.raises(NotImplementedError, match=named):
        run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)


#: (allocation, kv_block, head dim) of the model's prefill tilings the host refuses, at either
#: q_block: the vector cores' score rows of 1024 keys (fa-fp32's in fp32, pasa-exact's widened)
#: and their statistics do not fit the UB
MODEL_TILINGS_REFUSED = {
    **{(alg, 1024, d): "attention UB" for alg in ("fa-fp32", "pasa-exact") for d in (64, 128)},
}


def _model_tilings():
    """(q_block, kv_block, d) of every prefill tiling pasa-npu-model times (its Q_BLOCKS x
    KV_BLOCKS at the head dims of its shapes)."""
    from pasa_npu.tools.npu_extrapolate import KV_BLOCKS, Q_BLOCKS
    return [(qb, kvb, d) for d in (64, 128) for qb in Q_BLOCKS for kvb in KV_BLOCKS]


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("q_block,kv_block,d", [sim_param(*t) for t in _model_tilings()])
def test_every_tiling_the_model_times_runs_under_huaweis_implementation(q_block, kv_block, d, algorithm):
    """Each tiling the timing model may report for the README's figures sets up its buffers
    through Huawei's TPipe (which refuses a queue past an L1, L0 or UB budget) and computes the
    golden's answer on the simulator: two query tiles (the second part-filled) of two heads on
    two AI Cores, two kv blocks and a part-filled third. The tilings whose buffers an AI Core
    does not hold (MODEL_TILINGS_REFUSED) are refused by the host, by name, and the model then
    times the allocation at its others."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BNSD", B=1, Nq=2, Nkv=1, S1=q_block + 44, S2=2 * kv_block + 44, D=d,
                kv_block=kv_block, q_block=q_block)
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    refused = MODEL_TILINGS_REFUSED.get((algorithm, kv_block, d))
    if refused is not None:
        with pytest.raises(NotImplementedError, match=refused):
            run_kernels(q, k, v, SIM, algorithm=algorithm, **kw)
        return
    with emulated_cores(2):
        out, lse, tiling = run_kernels(q, k, v, SIM, algorithm=algorithm, **kw)
    assert (tiling["q_tile"], tiling["kv_block"], tiling["num_tasks"]) == (q_block, kv_block, 4), tiling
    assert tiling["bytes_per_core"]["l1"] <= TPIPE_L1_BYTES, tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_wide_heads_through_a_block_table(algorithm):
    """D = 256 read through a shuffled block table: K' and pasa-exact's block means are made per
    physical block in pieces of columns, a shared prefix once."""
    from _paged_problems import dense_problem, paged_problem
    from pasa_npu import backends
    case = dict(layout="BNSD", B=2, Nq=4, Nkv=2, S1=200, S2=700, D=256, kv_lens=[700, 333],
                sparse_mode=3, mask="optimized")
    q, k, v, kw = make_case(case, torch.float16)
    dense = dense_problem(q, k, v, algorithm=algorithm, **kw)
    paged, reference = paged_problem(dense, 128, "BNSD", shared_prefix=1)
    ascendc_emu.run(paged)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    assert tiling["cube_cols"] == 128, tiling
    with ascendc_numerics(tiling):
        backends.BACKENDS["torch"].runner()(reference)
    assert_matches_torch(paged.out, paged.lse, reference.out, reference.lse, algorithm, torch.float16, 6,
                         call=(q, k, v, kw), kv_lens=kv_lens(case), kv_block=tiling["kv_block"])


#: rows more than 4095 elements apart in GM (BSND, 33 heads of 128): the DMA's stride between
#: 16-row blocks does not reach, so the cube copies Q (and V) into L1 as NZ rather than Zz
WIDE_ROW_STRIDES = {
    "query": dict(layout="BSND", B=1, Nq=33, Nkv=3, S1=100, S2=300, D=128, sparse_mode=3, mask="optimized"),
    "query-and-values": dict(layout="BSND", B=1, Nq=33, Nkv=33, S1=100, S2=300, D=128),
}


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name", WIDE_ROW_STRIDES)
def test_rows_too_far_apart_for_zz_copies_take_nz(name, algorithm):
    """One-head tiles whose Q rows lie too far apart for the Zz copy take NZ, with each piece of
    rows loaded into L0A one 16-row block at a time: more L1 -> L0 loads than the same problem in
    BNSD (rows d apart, Zz), and the same outputs against the torch backend and the golden."""
    case = WIDE_ROW_STRIDES[name]
    q, k, v, kw = make_case(case, torch.float16)
    out, lse, tiling = run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)
    assert tiling["q_tile"] == case["S1"], tiling  # one head a tile
    loads = ascendc_emu.last_run_stats()["attention"]["pipe_instructions"]["MTE1"]
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)
    bnsd = dict(kw, input_layout="BNSD")
    run_kernels(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), "ascendc-emu", algorithm=algorithm, **bnsd)
    assert loads > ascendc_emu.last_run_stats()["attention"]["pipe_instructions"]["MTE1"]


#: head dims that are not multiples of 16 (the cube's fractal): Stable Diffusion 1.5's 40 and
#: 80 -> 40 here with V's of 64, 72 with V's of 40, 8; packed and decode rows among them
ODD_HEADS = {
    "sd15-40": dict(layout="BSH", B=2, Nq=4, Nkv=4, S1=300, S2=300, D=40, q_lens=[300, 177]),
    "72-v40-gqa-causal": dict(layout="BNSD", B=1, Nq=4, Nkv=2, S1=200, S2=333, D=72, Dv=40,
                              sparse_mode=3, mask="optimized"),
    "40-v64-tnd": dict(layout="TND", Nq=4, Nkv=2, D=40, Dv=64, q_cum=[1, 150, 260], kv_cum=[300, 450, 700]),
    "8-decode": dict(layout="BNSD", B=16, Nq=32, Nkv=4, S1=1, S2=900, D=8,
                     kv_lens=[900, 1, 500, 77, 899, 129, 640, 300, 2, 128, 255, 900, 33, 700, 450, 811]),
}


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name,backend", [(name, "ascendc-emu") for name in ODD_HEADS]
                         + [sim_param(name, SIM) for name in ODD_HEADS])
def test_head_dims_that_are_not_multiples_of_16(name, backend, algorithm):
    """Zero-padded to the next multiple of 16 on their way to the kernels: the zero columns add
    exact zeros to the scores and K's block means, and the output's extra columns are dropped.
    On 2 AI Cores; also under Huawei's implementation of the API."""
    from test_ascendc_emu import emulated_cores
    case = ODD_HEADS[name]
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(2):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert tiling["num_tasks"] * tiling["kv_splits"] > tiling["block_dim"], tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


def test_paged_heads_that_are_not_multiples_of_16_are_refused():
    """Padding a paged cache would copy all of it on every call."""
    from _paged_problems import dense_problem, paged_problem
    q, k, v, kw = make_case(dict(layout="BNSD", B=1, Nq=2, Nkv=2, S1=1, S2=256, D=40), torch.float16)
    paged, _ = paged_problem(dense_problem(q, k, v, algorithm="pasa", **kw), 128, "BNSD")
    with pytest.raises(NotImplementedError, match="paged KV needs head dims that are multiples of 16 .* got D=40"):
        ascendc_emu.run(paged)


def test_forced_vector_chunk_over_128_rows_is_refused():
    q, k, v, kw = make_case(WIDE_TILES["prefill"], torch.float16)
    with ascendc_emu.forcing_tiling(vec_chunk_rows=256), \
            pytest.raises(NotImplementedError, match="vecChunkRows must be a multiple of 16 of at most 128 .* got 256"):
        pasa_npu.fused_attention(q, k, v, backend="ascendc-emu", algorithm="pasa", **kw)


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
def test_more_tasks_without_keys_in_a_row_than_the_task_window(algorithm, backend):
    """Causal (bottom right) with query lengths far above the kv lengths: most query tiles see no
    key, so a core's stream of 56 tasks holds runs of consecutive tasks without keys longer
    than its window of tasks in flight. The cube skips them without fetching past that window
    (its ring of tasks would drop one still in flight); the vector cores write their zeros."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BSND", B=2, Nq=28, Nkv=4, S1=356, S2=47, D=64, sparse_mode=3,
                mask="optimized", kv_lens=[4, 14])
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    with emulated_cores(3):
        out, lse, tiling = run_kernels(q, k, v, backend, algorithm=algorithm, **kw)
    assert tiling["num_tasks"] > 3 * 8
    ref, ref_lse = torch_reference(q, k, v, tiling, algorithm=algorithm, **kw)
    assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16, kv_blocks(case),
                         call=(q, k, v, kw), kv_lens=kv_lens(case), kv_block=tiling["kv_block"])


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
def test_tasks_without_keys_filling_the_window_while_nothing_is_in_flight(algorithm, cores):
    """A ragged causal batch (bottom right) of 32-row tiles whose stream holds a run of tasks
    without keys as long as the cube's task window just as its last score tile left the
    pipeline: the cube must slide its window on rather than end its stream (it ended it, and the
    vector cores waited for scores that never came: a hang on hardware)."""
    from test_ascendc_emu import emulated_cores
    case = dict(layout="BSND", B=3, Nq=14, Nkv=2, S1=309, S2=427, D=32, sparse_mode=3, mask="optimized",
                kv_lens=[227, 87, 175], q_block=32)
    q, k, v, kw = make_case(case, torch.float16, seed=138)
    kw["repair_overflow"] = False
    with emulated_cores(cores):
        out, lse, tiling = run_kernels(q, k, v, "ascendc-emu", algorithm=algorithm, **kw)
    assert tiling["num_tasks"] == 420, tiling
    check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


def _random_case(rng: random.Random) -> tuple[dict, int]:
    """A shape no other test names: head dim, GQA group, lengths (the last kv block filled to
    any row), a causal band or none, ragged kv lengths or not, decode or prefill; and a core count."""
    d, nkv, group = rng.choice([32, 64, 128]), rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 7])
    decode = rng.random() < 0.25
    s1, s2, b = 1 if decode else rng.randint(1, 600), rng.randint(1, 1300), rng.randint(1, 3)
    case = dict(layout=rng.choice(["BNSD", "BSND", "BSH"]), B=b, Nq=nkv * group, Nkv=nkv, S1=s1, S2=s2, D=d)
    if not decode and rng.random() < 0.5:
        case.update(sparse_mode=3, mask="optimized")
    if rng.random() < 0.3:
        case["kv_lens"] = [rng.randint(1, s2) for _ in range(b)]
    return case, rng.choice([1, 2, 3, 5, 24])


def _random_call(rng: random.Random) -> tuple[dict, int]:
    """A call as a caller may make it: layout (TND packed included), GQA group, ragged query and
    kv lengths (a batch without keys among them), a causal mask, a band (sparse_mode 4) or an
    explicit mask, and a q_block and kv_block of its own; at least 4096 output values (the
    golden's RMSE bound is statistical); and a core count."""
    d, nkv, group = rng.choice([16, 32, 64, 128]), rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 5, 8])
    decode, b, nq = rng.random() < 0.2, rng.randint(1, 3), nkv * group
    least = -(-4096 // (nq * d))  # rows of output
    if decode:
        b = max(b, least)
    s1, s2 = 1 if decode else rng.randint(-(-least // b), max(-(-least // b), 400)), rng.randint(1, 900)
    if not decode and rng.random() < 0.2:
        q_lens = [rng.randint(1, s1) for _ in range(b)]
        q_lens[0] = s1
        kv_lens = [rng.randint(1, s2) for _ in range(b)]
        case = dict(layout="TND", Nq=nq, Nkv=nkv, D=d, q_cum=[sum(q_lens[:i + 1]) for i in range(b)],
                    kv_cum=[sum(kv_lens[:i + 1]) for i in range(b)])
    else:
        case = dict(layout=rng.choice(["BNSD", "BSND", "BSH"]), B=b, Nq=nq, Nkv=nkv, S1=s1, S2=s2, D=d)
        if rng.random() < 0.3:
            case["kv_lens"] = [rng.randint(0 if i > 0 else 1, s2) for i in range(b)]
    mask = rng.random()
    if mask < 0.3:
        case.update(sparse_mode=3, mask="optimized")
    elif mask < 0.4 and case["layout"] != "TND":
        case.update(sparse_mode=4, mask="optimized", pre=rng.randint(0, 300), next=rng.randint(0, 300))
    elif mask < 0.5 and case["layout"] != "TND" and not decode:
        case["mask"] = rng.choice(["random4d", "random2d"])
    case["q_block"] = rng.choice([16, 32, 64, 128, 256])
    case["kv_block"] = rng.choice([32, 64, 128, 256] if d <= 64 else [32, 64, 128])
    return case, rng.choice([1, 2, 3, 5, 24])


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_with_their_own_tilings(seed):
    """Seeded random calls (:func:`_random_call`) on random emulated core counts, every kernel
    allocation, against the torch backend and the golden as above."""
    from test_ascendc_emu import emulated_cores
    case, cores = _random_call(random.Random(2000 + seed))
    q, k, v, kw = make_case(case, torch.float16, seed=seed)
    kw["repair_overflow"] = False
    for algorithm in KERNEL_ALGORITHMS:
        with emulated_cores(cores):
            out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
        tiling = ascendc_emu.last_run_stats()["tiling"]
        assert tiling["q_tile"] <= case["q_block"] and tiling["kv_block"] == case["kv_block"], tiling
        check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes_on_random_core_counts(seed):
    """Seeded random shapes and emulated core counts, every kernel allocation, against the torch
    backend (pasa with split kv: against the golden, as above)."""
    from test_ascendc_emu import emulated_cores
    case, cores = _random_case(random.Random(1000 + seed))
    q, k, v, kw = make_case(case, torch.float16, seed=seed)
    kw["repair_overflow"] = False
    for algorithm in KERNEL_ALGORITHMS:
        with emulated_cores(cores):
            out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
        tiling = ascendc_emu.last_run_stats()["tiling"]
        check_against_torch_and_golden(out, lse, q, k, v, kw, algorithm, tiling, case)
