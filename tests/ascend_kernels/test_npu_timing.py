"""The emulation's pipe-level timing model against timelines derived by hand.

Each self-test kernel below is timed with a table of round numbers (ROUND); the expected
cycle counts are worked out in the comments, instruction by instruction, from the rules of
ascend_kernels/TIMING_MODEL.md: a pipe starts an instruction when the scalar unit has issued
it (1 cycle per dispatch) and the pipe is free; a flag fires when every earlier instruction
of its pipe has completed (latency included) and the waiting pipe starts nothing before it.
"""
from __future__ import annotations

import pytest

from pasa_npu import npu_params

pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from _emu_selftest import selftest_module  # noqa: E402

ROUND = dict(
    mmad_head_cycles=10, mte1_head_cycles=0, mte2_bytes_per_cycle=32, mte2_head_cycles=0,
    gm_read_latency_cycles=100, mte3_bytes_per_cycle=32, mte3_head_cycles=0,
    gm_write_latency_cycles=50, fix_bytes_per_cycle=128, fix_head_cycles=0, vec_head_cycles=10,
    scalar_issue_cycles=1, scalar_ub_access_cycles=10, vs_sync_cycles=30,
    scalar_gm_access_cycles=5, queue_depth=32, cross_core_latency_cycles=200,
    l2_aggregate_bytes_per_cycle=1e6, hbm_aggregate_bytes_per_cycle=1e6, launch_overhead_cycles=0,
    core_write_bytes_per_cycle=1e6,
    cube_macs_per_cycle=4096, mte1_l0a_bytes_per_cycle=256, mte1_l0b_bytes_per_cycle=128)


def timed(name, **over):
    table = npu_params.timing_only(npu_params.values(**{**ROUND, **over}))
    return selftest_module().run_selftest(name, table)["stats"]


def test_copy_scale_timeline():
    """DataCopy GM->UB (512 B at 32 B/cycle: 16 cycles, lands 100 later), EnQue/DeQue to V,
    Muls (2 repeats + 10: 12 cycles), EnQue/DeQue to MTE3, DataCopy UB->GM (16, visible 50 later):
      MTE2 [0, 16), done 116; EnQue fires at 116; V waits: Muls [116, 128);
      FreeTensor and EnQue on V fire at 128; MTE3 [128, 144), done 194; its FreeTensor fires at 194."""
    st = timed("timing_copy_scale")
    assert st["core_cycles"] == 194 and st["cycles"] == 194
    busy = st["pipe_busy_cycles"]
    assert (busy["MTE2"], busy["V"], busy["MTE3"]) == (16, 12, 16)
    assert busy["S"] == 9  # nine dispatches: 3 instructions and 6 queue flags


def test_explicit_flags_timeline():
    """synced_tbuf: MTE2 [0, 8) done 108; SetFlag<MTE2_V> fires 108, V waits; Muls (1 repeat:
    11) [108, 119); SetFlag<V_MTE3> fires 119; MTE3 [119, 127) done 177."""
    assert timed("synced_tbuf")["cycles"] == 177


def test_scalar_read_waits_for_the_vector_pipe():
    """Duplicate of 2 KiB (8 repeats: 18 cycles); GetValue of its output: the scalar unit waits
    for V (18) plus a vector->scalar synchronisation (30), then reads (10): 58."""
    st = timed("timing_scalar_read")
    assert st["cycles"] == 58 and st["scalar_ub_accesses"] == 1
    assert timed("timing_scalar_read", vs_sync_cycles=0)["cycles"] == 28


def test_scalar_gm_reads_hit_the_data_cache():
    """Scalar GM reads: a line's first read misses (gm_read_latency_cycles, 100), later reads of
    its words hit (scalar_gm_access_cycles, 5). Words 0, 1, 15, 16, 0: 100 + 5 + 5 + 100 + 5 = 215;
    after a whole-cache clean-and-invalidate words 0 and 16 miss again (415); after dropping
    word 16's line alone, 16 misses and 0 hits: 520."""
    st = timed("timing_scalar_gm_cache")
    assert (st["scalar_gm_accesses"], st["scalar_gm_misses"]) == (9, 5)
    assert st["cycles"] == 520
    assert timed("timing_scalar_gm_cache", gm_read_latency_cycles=200)["cycles"] == 520 + 5 * 100


def test_a_preload_fills_four_lines_while_the_scalar_unit_goes_on():
    """DataCachePreload of 256 bytes, issued at 0 (1 cycle): lines 0-3 land at 1 + 100. Word 0
    hits once its line has landed (101 + 5), word 48 (line 3) hits (111), word 64 (line 4)
    misses (211); a second preload of held lines brings nothing (212), word 16 hits: 217 =
    2 x gm_read_latency_cycles + 17."""
    st = timed("timing_scalar_gm_preload")
    assert (st["scalar_gm_accesses"], st["scalar_gm_misses"], st["scalar_gm_preloads"]) == (4, 1, 2)
    assert st["cycles"] == 217
    assert timed("timing_scalar_gm_preload", gm_read_latency_cycles=200)["cycles"] == 417


def test_the_data_cache_holds_32_kib_and_drops_the_least_recent_line():
    """513 lines read once each (513 misses: the cache holds 512 of 64 bytes), then the first
    line (evicted: a miss) and the last (held: a hit)."""
    st = timed("timing_scalar_gm_cache_eviction")
    assert (st["scalar_gm_accesses"], st["scalar_gm_misses"]) == (515, 514)
    assert st["cycles"] == 514 * 100 + 5


def test_barrier_all_drains_every_pipe():
    """DataCopy done at 116; PipeBarrier<PIPE_ALL> holds everything until 116; two Muls of 12."""
    assert timed("timing_barrier")["cycles"] == 140


def test_queue_depth_stalls_the_scalar_unit():
    """Three 12-cycle vector instructions, then a GM read on the idle MTE2 (8 cycles + 100).
    Queue of 32: the read is dispatched at cycle 3, done 111. Queue of 1: the scalar unit waits
    for each vector instruction to start before issuing the next (at 0, 12, 24), so the read
    leaves at 13, done 121."""
    assert timed("timing_queue_depth")["cycles"] == 111
    assert timed("timing_queue_depth", queue_depth=1)["cycles"] == 121


def test_cube_timeline():
    """cube_matmul (20 x 32 by 32 x 48):
      MTE2: A 1280 B [0, 40) done 140; EnQue; B 3072 B [140, 236) done 336 (the EnQue of A
        blocks MTE2 until A lands);
      MTE1 waits for both (336): A's two LoadData (1 KiB at 256 B/cycle: 4 each) to 344, B's
        two (1.5 KiB at 128: 12 each) to 368;
      M: Mmad 2 x 3 x 2 fractal steps + 10 = 22, [368, 390);
      FIX: 20 x 48 floats = 3840 B at 128 B/cycle: [390, 420), visible at 470."""
    st = timed("cube_matmul")
    assert st["cycles"] == 470
    busy = st["pipe_busy_cycles"]
    assert (busy["MTE2"], busy["MTE1"], busy["M"], busy["FIX"]) == (136, 32, 22, 30)


def test_unit_flag_hands_l0c_over_at_the_fixpipe_read():
    """timing_unit_flag: cube_matmul's operands (in L0A and L0B at 368), then L0C handed over by
    unitFlag: M: Mmad (2) [368, 390), Mmad (3) [390, 412) sets the flags at 412; FIX [412, 442)
    reads L0C and clears them at 442, its write visible at 492; the next Mmad (3) into the same
    L0C waits for the clear, not the visibility: [442, 464); FIX [464, 494), visible at 544.
    The first result is 2 A B (the chain accumulates), the second A B."""
    import torch
    st = selftest_module().run_selftest("timing_unit_flag", npu_params.timing_only(npu_params.values(**ROUND)))
    assert st["stats"]["cycles"] == 544
    assert timed("timing_unit_flag", gm_write_latency_cycles=500)["cycles"] == 994  # only the last write's
    busy = st["stats"]["pipe_busy_cycles"]
    assert (busy["M"], busy["FIX"]) == (66, 60)
    x = torch.tensor([float(i % 61) - 30.0 for i in range(20 * 32 + 32 * 48)], dtype=torch.float64)
    ab = x[:640].view(20, 32) @ x[640:].view(32, 48)  # exact in fp32 for these integers
    got = torch.tensor(st["values"], dtype=torch.float64).view(2, 20, 48)
    assert torch.equal(got[0], 2 * ab) and torch.equal(got[1], ab)


def test_cross_core_flag_is_an_edge():
    """AIV0: Duplicate [0, 12), MTE3 waits for its EnQue: copy [12, 28), visible 78; the
    cross-core flag raised on MTE3 fires at 78 and reaches the AIC 200 later (278); AIV1 copies
    nothing (its flag fires at 12). Mode 2 pairs the two: the AIC resumes at 278, reads 512 B
    [278, 294) that land at 394, and its MTE1 takes the tile at 394."""
    assert timed("cross_core_handoff")["core_cycles"] == 394
    assert timed("cross_core_handoff", cross_core_latency_cycles=0)["core_cycles"] == 194


def test_aggregate_bandwidth_bounds_the_launch():
    """1 KiB through GM at 1 byte/cycle for the whole chip: the launch takes 1024 cycles, not
    the core's 194, and the binding resource is the L2 bandwidth."""
    from pasa_npu.ascendc_emu import annotate_launch
    st = timed("timing_copy_scale", l2_aggregate_bytes_per_cycle=1.0, launch_overhead_cycles=100)
    assert st["l2_bound_cycles"] == 1024 and st["cycles"] == 1124
    assert annotate_launch(st, npu_params.values())["binding"] == "L2"


def test_ai_core_write_port_bounds_the_core():
    """cross_core_handoff writes 512 B (AIV0's MTE3) and its timelines end at 394 (see
    test_cross_core_flag_is_an_edge). At 0.25 B/cycle for the whole AI Core's writes the port
    takes 2048 cycles: the AI Core cannot finish earlier, and the port is what binds."""
    from pasa_npu.ascendc_emu import annotate_launch
    st = timed("cross_core_handoff", core_write_bytes_per_cycle=0.25)
    assert st["timeline_cycles"] == 394 and st["core_write_bound_cycles"] == 2048
    assert st["core_cycles"] == 2048 and st["cycles"] == 2048
    assert annotate_launch(st, npu_params.values())["binding"] == "WR"
    assert timed("cross_core_handoff")["core_cycles"] == 394  # the port at 1e6 B/cycle: no bound


def test_ai_core_read_port_is_shared_by_its_three_engines():
    """A one-core fa-fp32 call: the AIC (Q, K, V, P) and both AIVs (S, P V) read GM. The read
    port bound is all their bytes over the AI Core's rate; at 16 B/cycle it is later than every
    timeline (each engine alone at 16 B/cycle) and binds."""
    import torch

    import pasa_npu
    from pasa_npu import ascendc_emu
    q, k, v = (torch.randn(1, 1, n, 64, generator=torch.Generator().manual_seed(i)).half()
               for i, n in enumerate((128, 512, 512)))
    for rate in (110.0, 16.0):
        params = dict(npu_params.values(mte2_bytes_per_cycle=rate), core_num=1)
        with ascendc_emu.using_model_parameters(params):
            pasa_npu.fused_attention(q, k, v, num_heads=1, input_layout="BNSD", scale=0.125,
                                     algorithm="fa-fp32", backend="ascendc-emu")
        st = ascendc_emu.last_run_stats()["attention"]
        reads = st["gm_to_l1_bytes"] + st["gm_to_ub_bytes"]
        assert st["core_read_bound_cycles"] == pytest.approx(reads / rate)
        assert st["core_cycles"] == max(st["timeline_cycles"], st["core_read_bound_cycles"],
                                         st["core_write_bound_cycles"])
    assert st["core_read_bound_cycles"] > st["timeline_cycles"] and st["binding"] == "RD"


def test_parameter_table_is_complete_and_sourced():
    """Every timing field the emulation takes is in the table once, with a unit and a source;
    every assumption has a range containing its value."""
    table = npu_params.timing_only(npu_params.values())
    selftests = selftest_module()
    selftests.run_selftest("vector_scale", table)  # all of them accepted, none missing
    with pytest.raises(ValueError, match="needed"):
        selftests.run_selftest("vector_scale", {k: v for k, v in table.items() if k != "vec_head_cycles"})
    keys = ("INI", "CUBE", "VEC", "L2DOC", "HWC", "GEMM", "FAFIT", "ADD")
    for p in npu_params.ALL:
        assert p.unit and p.source
        named = [key for key in keys if key in p.source]
        if p.assumption:  # a range: no public source (said so), or sources that disagree
            assert p.low <= p.value <= p.high, p.name
            assert "no public source" in p.source or named, p.name
        else:  # one value: a named public source gives it
            assert named and "no public source" not in p.source, p.name
    by_name = {p.name: p for p in npu_params.ALL}
    mte2 = by_name["mte2_bytes_per_cycle"]  # per AI Core, as the platform file gives it
    assert mte2.value == 110 and "per AI Core" in mte2.unit and "INI" in mte2.source
    l2 = by_name["l2_aggregate_bytes_per_cycle"]  # CANN's matmul cost model
    assert l2.value == 2550 and l2.source.startswith("GEMM")
    vec = by_name["vec_head_cycles"]  # unpublished: a range, and said so
    assert vec.assumption and vec.low < vec.value < vec.high and "no public source" in vec.source
    fast, slow = npu_params.corner("fast"), npu_params.corner("slow")
    assert fast["vec_head_cycles"] < slow["vec_head_cycles"]
    assert fast["mte2_bytes_per_cycle"] > slow["mte2_bytes_per_cycle"]
    with pytest.raises(ValueError, match="unknown NPU model parameter"):
        npu_params.values(warp_size=32)
