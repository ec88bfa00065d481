"""The AscendC kernels' host tiling (the Atlas A2 budgets, PASA's shift matrix and beta) and
cost counters (bytes and cube work per path, vector work per kv block) under the CPU emulation,
and the emulation's own checks: what the hardware rejects, the emulation rejects. Their results
against the torch backend: test_ascendc_emu.py."""
from __future__ import annotations

import pathlib
import re

import pytest
import torch

import pasa_npu
from pasa_npu import npu_params

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import ascendc_emu  # noqa: E402
from test_ascendc_emu import KERNEL_ALGORITHMS  # noqa: E402
from _emu_selftest import selftest_module  # noqa: E402
from _support import TPIPE_L1_BYTES  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- tiling and counters


def _params(**over):
    p = dict(tiling_key=2, batch=1, num_heads=1, num_kv_heads=1, seq_q=256, seq_kv=256, head_dim=128,
             head_dim_v=128, q_layout=0, kv_layout=0, out_layout=0, out_dtype=0, mask_mode=0,
             scale=128 ** -0.5, beta=0.0, q_block=128, kv_block=128, core_num=24)
    p.update(over)
    return p


def test_tiling_fits_the_atlas_a2_budgets():
    caps = dict(l1=TPIPE_L1_BYTES, l0a=64 << 10, l0b=64 << 10, l0c=128 << 10, ub=192 << 10)
    for key in (0, 1, 2):
        use = emu.tiling(_params(tiling_key=key, beta=0.9 if key == 1 else 0.0))["bytes_per_core"]
        for mem, cap in caps.items():
            assert 0 < use[mem] <= cap, (key, mem)
            assert use["prep_" + mem] <= cap
    # two Q buffers of a 256-row tile fill L1 to 512 KiB with 256-key blocks at d = 128, more than TPipe
    # hands out, so the cube holds one; 128-row tiles keep two
    for key in (0, 1, 2):
        for q_block, buffers in ((256, 1), (128, 2)):
            t = emu.tiling(_params(tiling_key=key, q_block=q_block, kv_block=256, seq_kv=16384,
                                   beta=0.9 if key == 1 else 0.0))
            assert t["query_buffers"] == buffers and t["bytes_per_core"]["l1"] <= caps["l1"], (key, q_block, t)
    for key in (0, 1, 2):  # 256-row tiles: 128-row cube pieces, each vector core's 128 rows in chunks
        t = emu.tiling(_params(tiling_key=key, q_block=256, beta=0.9 if key == 1 else 0.0))
        assert (t["cube_rows"], t["vec_rows"]) == (128, 128) and t["vec_chunk_rows"] in (32, 64), (key, t)
        assert t["bytes_per_core"]["l0a"] <= caps["l0a"] and t["bytes_per_core"]["ub"] <= caps["ub"] - (8 << 10)
    # pasa at 128 x 256 tiles, d = 128: each vector core's 64 rows in one chunk, one buffer of each tile
    # (its block means are the cube's row constants: no S' is widened to fp32); the others keep
    # two-buffered chunks of 32
    t = emu.tiling(_params(tiling_key=1, q_block=128, kv_block=256, beta=0.9))
    assert (t["vec_chunk_rows"], t["vec_sum_rows"], t["ub_score_buffers"], t["row_constants"]) == (64, 64, 1, 1), t
    assert t["bytes_per_core"]["ub"] <= caps["ub"] - (8 << 10), t
    for key in (0, 2):
        t = emu.tiling(_params(tiling_key=key, q_block=128, kv_block=256))
        assert (t["vec_chunk_rows"], t["vec_sum_rows"], t["ub_score_buffers"]) == (32, 32, 2), (key, t)
    # a key or value block larger than an L0B buffer (32 KiB) is held a piece of 128 keys or more at a time
    # with every column (cube_keys), else cut into pieces of columns (cube_cols); the key preprocessing
    # holds every key, prep_cols columns at a time
    for d, n, keys, cols, prep in ((128, 128, 128, 128, 128), (128, 256, 128, 128, 64), (64, 256, 256, 64, 64),
                                   (192, 128, 128, 128, 128), (256, 128, 128, 128, 128),
                                   (256, 64, 64, 256, 256)):
        for key in (0, 1, 2):
            t = emu.tiling(_params(tiling_key=key, head_dim=d, head_dim_v=d, kv_block=n, beta=0.9 if key == 1 else 0.0))
            assert (t["cube_keys"], t["cube_cols"], t["prep_cols"]) == (keys, cols, prep), (d, n, key, t)
            assert t["bytes_per_core"]["l0b"] <= caps["l0b"], (d, n, key, t)
            for mem in ("l0a", "l0b", "l0c"):
                assert t["bytes_per_core"]["prep_" + mem] <= caps[mem], (d, n, key, mem, t)
    # pasa's M^T (n x n fp16) stays in L0A beside the row of ones up to 128-key blocks; at 256 keys,
    # two pieces of 64 rows fill L0A (2 x 64 x 256 x 2 bytes), the ones taking a piece's buffer
    for n, rows in ((64, 64), (128, 128), (256, 64)):
        t = emu.tiling(_params(tiling_key=1, kv_block=n, beta=0.9))
        assert t["shift_rows"] == rows and t["bytes_per_core"]["prep_l0a"] == (
            n * n * 2 + 16 * n * 2 if rows == n else 2 * rows * n * 2), (n, t)
    with pytest.raises(ValueError, match="headDim must be a positive multiple of 16"):
        emu.tiling(_params(head_dim=72))


def test_pasa_tiling_rounds_the_shift_matrix_like_the_torch_backend():
    """The host builds M = scale (I - beta/n J) in fp16 and gamma from fp32 as the torch backend does."""
    from pasa_npu.beta import shift_matrix
    beta, n, scale = pasa_npu.beta.default_beta(64, 0.125), 64, 0.125
    t = emu.tiling(_params(tiling_key=1, kv_block=n, scale=scale, beta=beta))
    m = shift_matrix(beta, n, torch.float16, scale)
    bits = m.view(torch.int16)
    assert t["shift_diag_bits"] == int(bits[0, 0]) & 0xFFFF
    assert t["shift_off_bits"] == int((-m).view(torch.int16)[0, 1]) & 0xFFFF
    gamma = torch.tensor(beta / (1 - beta)).to(torch.float16).item()  # fp32 then fp16, as the torch backend
    assert t["gamma"] == gamma


@pytest.mark.parametrize("n,scale", [(128, 1.0), (128, 128 ** -0.5), (64, 0.125), (32, 0.2)])
def test_host_beta_solver_equals_the_python_solver(n, scale):
    from pasa_npu.beta import optimal_beta
    for beta0 in (1 - 2 ** -4, 1 - 2 ** -5, 1 - 2 ** -6):
        assert emu.optimal_beta(beta0, n, scale) == optimal_beta(beta0, n, torch.float16, scale)
    # beta < 0 asks the host tiling for the default: the same gamma and matrix entries
    auto = emu.tiling(_params(tiling_key=1, kv_block=n, scale=scale, beta=-1.0))
    given = emu.tiling(_params(tiling_key=1, kv_block=n, scale=scale,
                               beta=pasa_npu.beta.default_beta(n, scale)))
    assert (auto["gamma"], auto["shift_diag_bits"]) == (given["gamma"], given["shift_diag_bits"])


def test_cost_counters_per_path():
    """Bytes per path and cube work of one call, against the counts the tiling implies: one
    head, 256 x 256, D = 64, 128 x 128 tiles: 2 query tiles x 2 kv blocks; the key
    preprocessing in a launch of its own, and inside the attention launch, where it adds its
    own counts and one SyncAll wait per core. The two tasks are dealt whole (no tail pieces).
    pasa with the row sums of P' on the vector cores (``vector_prob_sums``) drops the cube's
    share of them: its Mmads, MACs and exchanged bytes are then pasa-exact's."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 256, 64, generator=gen).half() for _ in range(3))
    kw = dict(num_heads=1, input_layout="BNSD", scale=0.125)
    stats, folded = {}, {}
    for algorithm in ("fa-fp32", "pasa", "pasa-exact"):
        with ascendc_emu.forcing_tiling(prep_launch=1, tail_pieces=1):
            pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
        stats[algorithm] = ascendc_emu.last_run_stats()
        if algorithm == "pasa":
            with ascendc_emu.forcing_tiling(prep_launch=1, tail_pieces=1, vector_prob_sums=1):
                pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
            stats["pasa, vector sums"] = ascendc_emu.last_run_stats()
        with ascendc_emu.forcing_tiling(tail_pieces=1):
            pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
        folded[algorithm] = ascendc_emu.last_run_stats()
    for algorithm in ("pasa", "pasa-exact"):
        launched, inside = stats[algorithm], folded[algorithm]
        assert inside["tiling"]["prep_in_attention"] and not launched["tiling"]["prep_in_attention"]
        assert inside["preprocess"] is None and launched["preprocess"] is not None
        for key in ("mmad_calls", "cube_macs", "gm_to_l1_bytes", "l0c_to_gm_bytes", "gm_to_ub_bytes",
                    "ub_to_gm_bytes", "vector_instructions", "cross_core_sets"):
            assert inside["attention"][key] == launched["attention"][key] + launched["preprocess"][key], key
        assert inside["attention"]["cross_core_waits"] == (launched["attention"]["cross_core_waits"]
                                                           + launched["preprocess"]["cross_core_waits"]
                                                           + 3 * inside["tiling"]["block_dim"])
    tasks, tiles = 2, 2 * 2
    for algorithm in ("fa-fp32", "pasa", "pasa-exact"):
        att = stats[algorithm]["attention"]
        # pasa and pasa-exact: one more Mmad per task, the row constants (blocks x rows x D); pasa:
        # one more per tile, the row sums of P' (rows x 16 ones x keys)
        constants = (tasks, tasks * 2 * 128 * 64)
        extra_calls, extra_macs = {"pasa-exact": constants,
                                   "pasa": (tiles + constants[0], tiles * 128 * 16 * 128 + constants[1])
                                   }.get(algorithm, (0, 0))
        assert att["mmad_calls"] == 2 * tiles + extra_calls
        assert att["cube_macs"] == tiles * (128 * 128 * 64 + 128 * 64 * 128) + extra_macs
        # the checked allocations' repair pass: per AI Core, FLAGS_READY by each AIV and
        # FLAGS_SEEN by the AIC, waited for by the AIC and by each AIV
        repair_pass = 3 * stats[algorithm]["tiling"]["block_dim"] if algorithm != "fa-fp32" else 0
        assert stats[algorithm]["tiling"]["repair_in_launch"] == (algorithm != "fa-fp32")
        assert att["cross_core_sets"] == 4 * tiles + repair_pass   # S and PV by the AIC, P by each AIV
        assert att["cross_core_waits"] == 5 * tiles + repair_pass  # P by the AIC, S and PV by each AIV
    assert stats["fa-fp32"]["preprocess"] is None
    assert stats["pasa"]["preprocess"]["cube_macs"] == 2 * (128 * 64 * 128 + 64 * 128)  # M^T K, ones^T K per block
    assert stats["pasa-exact"]["preprocess"]["cube_macs"] == 2 * 1 * 64 * 128      # ones^T K per block
    # fp16 S' and P'V halve what crosses from cube to vector, against fa-fp32's fp32 tiles; pasa's
    # P'V rows carry 16 more columns, its row sums of P'
    per_tile = 128 * 128 + 128 * 64  # S elements + P V elements
    sums = 128 * 16
    assert stats["fa-fp32"]["attention"]["l0c_to_gm_bytes"] == tiles * per_tile * 4
    constants = tasks * 2 * 128 * 4  # the row constants, fp32
    assert stats["pasa"]["attention"]["l0c_to_gm_bytes"] == tiles * (per_tile + sums) * 2 + constants
    assert stats["pasa-exact"]["attention"]["l0c_to_gm_bytes"] == tiles * per_tile * 2 + constants
    assert stats["pasa"]["attention"]["gm_to_ub_bytes"] == (stats["fa-fp32"]["attention"]["gm_to_ub_bytes"] // 2
                                                            + tiles * sums * 2 + constants)
    assert stats["pasa"]["tiling"]["pv_cols"] == 64 + 16 and stats["pasa-exact"]["tiling"]["pv_cols"] == 64
    vector_sums = stats["pasa, vector sums"]
    assert vector_sums["tiling"]["pv_cols"] == 64
    for key in ("mmad_calls", "cube_macs", "l0c_to_gm_bytes", "gm_to_ub_bytes"):
        assert vector_sums["attention"][key] == stats["pasa-exact"]["attention"][key], key
    assert vector_sums["preprocess"]["cube_macs"] == stats["pasa"]["preprocess"]["cube_macs"]


def test_prob_sums_on_the_vector_cores_are_pasa_s_choice():
    """``vector_prob_sums`` moves pasa's row sums of P' to the vector cores: its P'V tile loses
    the sums' 16 columns, the cube its ones beside V (a piece of V alone may then fill L0B),
    and the vector cores widen P' to fp32 in rows that fit their UB (16 rows of 1024 keys do
    not, beside the tiles, at d = 128: that tiling is refused); the host refuses the choice for
    the other allocations, naming it."""
    for kv_block, q_block in ((256, 128), (512, 256), (512, 128)):
        shape = dict(tiling_key=1, beta=0.9, q_block=q_block, kv_block=kv_block, seq_kv=4096)
        on_cube, on_vector = emu.tiling(_params(**shape)), emu.tiling(_params(**shape, vector_prob_sums=1))
        assert on_cube["pv_cols"] == 128 + 16 and on_vector["pv_cols"] == 128, (kv_block, on_vector)
        assert on_vector["cube_keys"] >= on_cube["cube_keys"], (kv_block, on_cube, on_vector)
        assert on_vector["vec_chunk_rows"] % on_vector["vec_sum_rows"] == 0, on_vector
        assert on_vector["bytes_per_core"]["ub"] <= 192 << 10, on_vector
    with pytest.raises(ValueError, match="attention UB .* needs"):
        emu.tiling(_params(tiling_key=1, beta=0.9, kv_block=1024, seq_kv=4096, vector_prob_sums=1))
    for key in (0, 2):
        with pytest.raises(ValueError, match=f"vectorProbSums applies to pasa .* got tilingKey {key}"):
            emu.tiling(_params(tiling_key=key, vector_prob_sums=1))


def _runs_forcing(choice, algorithm, b, h, hkv, sq, skv, causal, seed):
    """{0: ..., 1: ...}: (output, LSE, last_run_stats) of one BNSD call at d = 64 (causal: sparse
    mode 3) with the host's tiling ``choice`` forced to 0 and to 1."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, 64, generator=gen).half()
    k, v = (torch.randn(b, hkv, skv, 64, generator=gen).half() for _ in range(2))
    kw = dict(num_heads=h, num_key_value_heads=hkv, input_layout="BNSD", scale=0.125,
              algorithm=algorithm, backend="ascendc-emu", softmax_lse_flag=True)
    if causal:
        kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    runs = {}
    for forced in (0, 1):
        with ascendc_emu.forcing_tiling(**{choice: forced}):
            out, lse = pasa_npu.fused_attention(q, k, v, **kw)[:2]
        runs[forced] = out, lse, ascendc_emu.last_run_stats()
    return runs


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
@pytest.mark.parametrize("b,h,hkv,sq,skv,causal,schedule", [
    (1, 8, 8, 512, 500, True, "tasks outnumber the cores"),
    (1, 2, 1, 100, 1500, True, "launch widened past the tasks"),
    (1, 1, 1, 128, 4000, False, "split kv")])
def test_key_preprocessing_inside_the_attention_launch_gives_the_same_bits(algorithm, b, h, hkv, sq,
                                                                           skv, causal, schedule):
    """The key preprocessing at the start of the attention launch, its cores meeting at
    SyncAll, writes the same output and LSE as in a launch of its own (GQA, causal bands,
    part-filled last blocks, overflow-checked calls) on each schedule: more tasks than AI
    Cores, a launch of more AI Cores than the attention has tasks, and split kv."""
    runs = _runs_forcing("prep_launch", algorithm, b, h, hkv, sq, skv, causal, seed=5)
    (out, lse, inside), (out_own, lse_own, own) = runs[0], runs[1]
    tiling = inside["tiling"]
    assert tiling["prep_in_attention"] and inside["preprocess"] is None
    assert own["preprocess"] is not None
    assert {"tasks outnumber the cores": tiling["num_tasks"] > tiling["block_dim"],
            "launch widened past the tasks": tiling["num_tasks"] < tiling["block_dim"] == tiling["prep_dim"],
            "split kv": tiling["kv_splits"] > 1}[schedule], tiling
    assert torch.equal(out, out_own) and torch.equal(lse, lse_own)


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("b,h,hkv,sq,skv,causal,pieces", [
    (1, 2, 1, 300, 700, True, 4),     # GQA, a causal band, a query's last partial tile, part-filled blocks
    (2, 3, 3, 256, 256, False, 2),    # 12 tasks on 24 AI Cores: 2 pieces each
    (1, 10, 5, 384, 520, True, 4)])   # 30 tasks: a full round, then 6 tasks of 4 pieces each
def test_tail_pieces_give_the_same_bits(algorithm, b, h, hkv, sq, skv, causal, pieces):
    """A prefill whose last round leaves AI Cores idle deals that round's tasks in pieces of their
    query rows, the AIVs sharing each piece's rows: every row's output and LSE are bit for bit
    those of the same tasks dealt whole (overflow-checked calls, so the repair pass deals the
    same pieces)."""
    runs = _runs_forcing("tail_pieces", algorithm, b, h, hkv, sq, skv, causal, seed=6)
    (out, lse, cut), (out_whole, lse_whole, whole) = runs[0], runs[1]
    cut, whole = cut["tiling"], whole["tiling"]
    tasks = whole["num_tasks"]
    assert whole["tail_pieces"] == 1 and tasks % 24 > 0, whole
    tail = tasks % 24
    assert cut["tail_pieces"] == pieces and cut["tail_from"] == tasks - tail, cut
    assert cut["num_tasks"] == tasks - tail + tail * pieces, cut
    assert torch.equal(out, out_whole) and torch.equal(lse, lse_whole)


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
def test_vector_work_per_block_is_whole_tile(algorithm):
    """Issue 29's budget at 128 x 128 blocks, d = 128: per kv block and per vector core at most
    64 vector instructions and 4 scalar UB accesses, in the steady state (the difference
    between a 12-block and a 4-block task, one tile on one AI Core) and on a causal diagonal
    block (a 1-block causal tile: every instruction of its task counted)."""
    def counts(s_kv, causal=False, masked=None):
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(1, 1, 128, 128, generator=gen).half()
        k, v = (torch.randn(1, 1, s_kv, 128, generator=gen).half() for _ in range(2))
        kw = dict(num_heads=1, input_layout="BNSD", algorithm=algorithm, backend="ascendc-emu")
        if causal:
            kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
        if masked == "explicit":  # every block carries mask bytes
            kw.update(atten_mask=torch.rand(128, s_kv, generator=gen) < 0.3)
        with ascendc_emu.using_model_parameters(dict(ascendc_emu.model_parameters(), core_num=1)):
            pasa_npu.fused_attention(q, k, v, **kw)
        att = ascendc_emu.last_run_stats()["attention"]
        return att["vector_instructions"] / 2, att["scalar_ub_accesses"] / 2  # per AIV
    (v4, s4), (v12, s12) = counts(4 * 128), counts(12 * 128)
    per_block, scalar_per_block = (v12 - v4) / 8, (s12 - s4) / 8
    assert per_block <= 64 and scalar_per_block <= 4, (per_block, scalar_per_block)
    diagonal, _ = counts(128, causal=True)  # one masked block plus the task's start and end
    one, _ = counts(128)
    assert diagonal - one <= 64 - per_block, "the mask of a diagonal block exceeds the budget"
    # masked steady state: an explicit mask on every block (measured per block and AIV:
    # fa-fp32 25, pasa 43, pasa-exact 44.5 vector instructions, no scalar UB access)
    (m4, ms4), (m12, ms12) = counts(4 * 128, masked="explicit"), counts(12 * 128, masked="explicit")
    assert (m12 - m4) / 8 <= 64 and (ms12 - ms4) / 8 <= 4, ((m12 - m4) / 8, (ms12 - ms4) / 8)


@pytest.mark.parametrize("algorithm", ("pasa", "pasa-exact"))
def test_a_kv_block_waits_for_one_gm_read_latency(algorithm):
    """The cube copies the keys, P' and values of the steps to come before it queues any of them,
    and the vector cores copy S' and pasa-exact's row constants before they queue either, so that
    a kv block waits on each MTE2 pipe for one GM read's latency, not one per copy. At a 128 x 256
    tile, where pasa's cube and pasa-exact's vector cores bind (one task on one AI Core, the
    attention launch alone, the difference between 16 and 8 blocks): 300 cycles more latency
    cost a block at most 300 cycles more; with a wait per copy they cost pasa 900 and pasa-exact
    572."""
    def per_block(latency):
        cycles = []
        for blocks in (8, 16):
            gen = torch.Generator().manual_seed(5)
            q = torch.randn(1, 1, 128, 128, generator=gen).half()
            k, v = (torch.randn(1, 1, blocks * 256, 128, generator=gen).half() for _ in range(2))
            params = dict(ascendc_emu.model_parameters(), core_num=1, gm_read_latency_cycles=latency)
            with ascendc_emu.using_model_parameters(params), ascendc_emu.forcing_tiling(prep_launch=1):
                pasa_npu.fused_attention(q, k, v, num_heads=1, input_layout="BNSD", algorithm=algorithm,
                                         backend="ascendc-emu", q_block=128, kv_block=256, scale=128 ** -0.5)
            stats = ascendc_emu.last_run_stats()
            assert stats["repair"] is None
            cycles.append(stats["attention"]["core_cycles"])
        return (cycles[1] - cycles[0]) / 8
    slower = per_block(536) - per_block(236)
    assert slower <= 300, slower


@pytest.mark.parametrize("algorithm", ("pasa", "pasa-exact"))
def test_key_means_through_the_column_sum_ring(algorithm):
    """The key preprocessing on one AI Core runs ahead of its vector cores through the ring of
    column-sum slots (PASA_SUM_SLOTS = 8), its keys staged a block ahead: 20 blocks, six of them
    part-filled (pasa: each waits for every block before it to be read, the one slot of M^T K), in a
    launch of its own and inside the attention launch; the result holds to the torch backend's
    (pasa: with the block means from the keys)."""
    from test_ascendc_emu import assert_matches_torch, torch_reference
    gen = torch.Generator().manual_seed(11)
    lens = [300, 517, 129]  # 3 + 5 + 2 blocks of 128 keys per kv head, each batch's last part-filled
    q = torch.randn(3, 4, 64, 64, generator=gen).half()
    k = (torch.randn(3, 2, 517, 64, generator=gen) + 2).half()
    v = torch.randn(3, 2, 517, 64, generator=gen).half()
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", scale=0.125, algorithm=algorithm,
              actual_seq_lengths_kv=lens, repair_overflow=False, softmax_lse_flag=True)
    for prep_launch in (0, 1):
        with ascendc_emu.using_model_parameters(dict(ascendc_emu.model_parameters(), core_num=1)), \
                ascendc_emu.forcing_tiling(prep_launch=prep_launch):
            out, lse = pasa_npu.fused_attention(q, k, v, backend="ascendc-emu", **kw)[:2]
        tiling = ascendc_emu.last_run_stats()["tiling"]
        assert tiling["prep_dim"] == 1 and tiling["row_constants"] and tiling["prep_in_attention"] != prep_launch
        ref, ref_lse = torch_reference(q, k, v, tiling, **kw)[:2]
        assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16, 5,
                             call=(q, k, v, kw), kv_lens=lens, kv_block=128)


@pytest.mark.parametrize("algorithm", ("pasa", "pasa-exact"))
def test_part_filled_block_adds_whole_tile_vector_work(algorithm):
    """The key preprocessing of a part-filled last block (500 keys: 116 in the last of 4 blocks)
    costs the vector cores a few whole-tile instructions and no scalar UB access over the
    same call with whole blocks (measured per AIV: pasa 4.5, pasa-exact 2). pasa's whole blocks
    give its vector cores two instructions each, on the first AIV: the key mean's scaling and
    rounding."""
    def counts(s_kv):
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(1, 1, 128, 128, generator=gen).half()
        k, v = (torch.randn(1, 1, s_kv, 128, generator=gen).half() for _ in range(2))
        with ascendc_emu.using_model_parameters(dict(ascendc_emu.model_parameters(), core_num=1)), \
                ascendc_emu.forcing_tiling(prep_launch=1):  # the preprocessing's counts on their own
            pasa_npu.fused_attention(q, k, v, num_heads=1, input_layout="BNSD", algorithm=algorithm,
                                     backend="ascendc-emu")
        prep = ascendc_emu.last_run_stats()["preprocess"]
        return prep["vector_instructions"] / 2, prep["scalar_ub_accesses"] / 2
    (whole, whole_scalar), (part, part_scalar) = counts(512), counts(500)
    if algorithm == "pasa":
        assert whole == 4 * 2 / 2  # 4 blocks, 2 instructions each, averaged over the 2 AIVs
    assert 0 < part - whole <= 8 and part_scalar == whole_scalar == 0, (whole, part)


# --------------------------------------------------------------------------- the emulation itself


REJECTED = {
    "ub_over_capacity": "UB over capacity",
    "l0a_over_capacity": "L0A over capacity",
    "misaligned_ub_copy": "not 32-byte aligned",
    "unaligned_copy_length": "not a multiple of 32",
    "dequeue_before_enqueue": "DeQue on an empty queue",
    "alloc_without_free": "all 1 buffers are in use",
    "missing_pipe_sync": "pipe hazard: Muls on PIPE_V",
    "wait_without_set": "no matching SetFlag",
    "set_twice": "twice without a WaitFlag",
    "set_never_waited": "never waited for",
    "missing_cross_core_flag": "deadlock",
    "cross_core_flag_never_waited": "more time",
    "cross_core_counter_overflow": "would exceed 15",
    "sync_all_missed": "SyncAll was reached by 6 of the launch's 9 cores",
    "sync_all_then_fail": "no matching SetFlag",  # past a SyncAll, the later AI Cores ran on
    "sync_all_aiv_only_in_mix": "SyncAll<true> in a MIX kernel",
    "cross_core_wrong_pipe": "pipe hazard: DataCopy\\(GM->L1, Nd2Nz\\) on PIPE_MTE2",
    "queue_event_ids_exhausted": "all 8 event IDs of HardEvent::MTE1_MTE2 are held",
    "fixed_event_id_under_queue": "a queue holds this event ID with its own flag set",
    "partial_overlap": "partially overlaps",
    "mmad_misaligned": "not 512-byte aligned",
    "fixpipe_without_quant": "needs quantPre F322F16",
    "unit_flag_fixpipe_before_the_last_mmad": "no Mmad with unitFlag 3 has completed: the Fixpipe would wait forever",
    "unit_flag_mmad_over_an_unread_result": "the Mmad would wait for a Fixpipe issued after it",
    "unit_flag_fixpipe_without_it": "without unitFlag while an Mmad with unitFlag 3 left its flag set",
    "select_over_api_scratch": "TMP_UB_OFFSET",
}


TIMING = npu_params.timing_only(npu_params.values())


def selftest(name, timeout_s=5.0):
    return selftest_module().run_selftest(name, TIMING, timeout_s=timeout_s)["values"]


def test_every_selftest_is_covered():
    names = set(selftest_module().selftest_names())
    timing = {n for n in names if n.startswith("timing_")}  # tests/ascend_kernels/test_npu_timing.py
    assert set(REJECTED) | {"vector_scale", "cube_matmul", "synced_tbuf", "cross_core_handoff",
                            "sync_all_exchange"} | timing == names


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_emulation_rejects_what_the_hardware_rejects(name):
    with pytest.raises(RuntimeError, match=REJECTED[name]):
        selftest(name)


def test_deadlock_is_reported_not_hung():
    """A wait nobody can satisfy ends at once with an error (the cores' states are known), well
    before the timeout."""
    import time
    selftest_module()  # built on first use: not part of the time
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="AIV0 waits CrossCoreWaitFlag\\(3\\)"):
        selftest("missing_cross_core_flag", timeout_s=30.0)
    assert time.monotonic() - start < 5.0


def _inputs(n):
    return torch.tensor([float(i % 61) - 30.0 for i in range(n)], dtype=torch.float64)


def test_correct_programs_run():
    x = _inputs(256)
    assert selftest("vector_scale") == (2 * x).tolist()
    assert selftest("synced_tbuf") == (-_inputs(128)).tolist()
    assert selftest("cross_core_handoff") == [3.0] * 256


def test_sync_all_orders_the_ai_cores():
    """Past SyncAll<false> each of 4 AI Cores reads what the next one wrote before it (the
    emulation runs the AI Cores in turns and parks each at the barrier), and every core resumes
    after the latest arrival plus the barrier's three cross-core hops."""
    r = selftest_module().run_selftest("sync_all_exchange", TIMING, timeout_s=5.0)
    written = [float(b + 1) for b in range(4) for _ in range(16)]
    read = [float((b + 1) % 4 + 1) for b in range(4) for _ in range(16)]
    assert r["values"] == written + read
    assert r["stats"]["timeline_cycles"] > 3 * TIMING["cross_core_latency_cycles"]


def test_cube_formats_and_accumulation():
    """GM -> L1 (ND->NZ) -> L0A (Zz) / L0B (Zn, transposed fractals) -> Mmad -> Fixpipe (NZ->ND)
    computes A B, accumulating each output in fp32 in k order (the emulation's documented model)."""
    x = _inputs(20 * 32 + 32 * 48)
    a, b = x[:640].view(20, 32), x[640:].view(32, 48)
    got = torch.tensor(selftest("cube_matmul"), dtype=torch.float32).view(20, 48)
    acc = torch.zeros(20, 48, dtype=torch.float32)
    for kk in range(32):  # sequential fp32 accumulation; every product is exact in fp32 here
        acc = (acc.double() + a[:, kk:kk + 1] * b[kk:kk + 1, :]).float()
    assert torch.equal(got, acc)
    assert torch.equal(got.double(), a @ b)  # and here the sum is exact too


def test_kernel_sources_use_only_the_ascendc_api():
    """The kernels include kernel_operator.h and their own headers, nothing of the emulation:
    building them for an NPU changes only the include path."""
    for path in sorted((ROOT / "ascend_kernels" / "kernels").glob("*")):
        text = path.read_text()
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', text)
        own = {p.name for p in (ROOT / "ascend_kernels" / "kernels").glob("*.h")}
        assert set(includes) <= {"kernel_operator.h", "cstdint"} | own, path
        assert "emu::" not in text and "emu_" not in text, path
