"""What serving stacks call, on the AscendC kernels under emulation (backend "ascendc-emu"):
paged KV read through a block table, TND batches mixing decode and chunked prefill, decode
split across AI Cores. Against the torch backend at test_ascendc_emu's bounds, or where a
split changes pasa's rounding, against the fp64 golden."""
from __future__ import annotations

import pytest
import torch

import pasa_npu

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from pasa_npu import ascendc_emu  # noqa: E402
from test_ascendc_emu import KERNEL_ALGORITHMS, assert_matches_torch, torch_reference  # noqa: E402
from _bounds import ascendc_numerics  # noqa: E402
from test_golden import kv_lens, make_case  # noqa: E402

# --------------------------------------------------------------------------- paged KV


PAGED_CASES = {
    # prefill, GQA, causal bottom-right, a shared two-block prefix, both cache shapes below
    "prefill-shared-prefix": (dict(layout="BNSD", B=2, Nq=4, Nkv=2, S1=96, S2=300, D=32,
                                   kv_lens=[300, 260], sparse_mode=3, mask="optimized"), 128, 2),
    # decode with stacked GQA heads, ragged lengths, a shared block
    "decode-gqa": (dict(layout="BSH", B=3, Nq=8, Nkv=2, S1=1, S2=700, D=64,
                        kv_lens=[700, 129, 513]), 128, 1),
    # what serving stacks call: TND rows of decode and chunked-prefill requests (q_len < kv_len),
    # sparse mode 3 bottom-right per request, a shared prefix block
    "tnd-mixed-chunked": (dict(layout="TND", Nq=4, Nkv=2, D=32, q_cum=[1, 41, 42, 170],
                               kv_cum=[300, 560, 689, 945], sparse_mode=3, mask="optimized"), 128, 1),
    # block_size 256 holds two kv blocks of 128: K' per sub-block of each physical block
    "prefill-block-256": (dict(layout="BSND", B=2, Nq=2, Nkv=2, S1=40, S2=600, D=32,
                               kv_lens=[600, 300]), 256, 1),
}


@pytest.mark.parametrize("cache_shape", ["BNSD", "BSH"])
@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_kv_matches_torch_backend(name, algorithm, cache_shape):
    """K and V read through a block table (non-contiguous physical blocks, a prefix shared by
    every sequence) equal the torch backend's dense result over the same keys, at the bounds
    of the dense matrix."""
    from _paged_problems import dense_problem, paged_problem
    from pasa_npu import backends
    case, block_size, shared = PAGED_CASES[name]
    q, k, v, kw = make_case(case, torch.float16)
    dense = dense_problem(q, k, v, algorithm=algorithm, **kw)
    paged, reference = paged_problem(dense, block_size, cache_shape, shared_prefix=shared)
    ascendc_emu.run(paged)
    tiling = ascendc_emu.last_run_stats()["tiling"]
    with ascendc_numerics(tiling):
        backends.BACKENDS["torch"].runner()(reference)
    assert_matches_torch(paged.out, paged.lse, reference.out, reference.lse, algorithm,
                         torch.float16, -(-max(kv_lens(case)) // tiling["kv_block"]),
                         call=(q, k, v, kw), kv_lens=kv_lens(case), kv_block=tiling["kv_block"])


def test_paged_kv_preprocesses_a_shared_block_once():
    """pasa-exact's block means per physical block: a prefix block shared by four sequences is
    centred once (the preprocessing's cube work counts each physical kv block once)."""
    from _paged_problems import dense_problem, paged_problem
    case = dict(layout="BNSD", B=4, Nq=2, Nkv=2, S1=64, S2=512, D=32, kv_lens=[512] * 4)
    q, k, v, kw = make_case(case, torch.float16)
    dense = dense_problem(q, k, v, algorithm="pasa-exact", **kw)
    macs = {}
    for shared in (0, 2):
        paged, _ = paged_problem(dense, 128, shared_prefix=shared)
        with ascendc_emu.forcing_tiling(prep_launch=1):  # the preprocessing's counts on their own
            ascendc_emu.run(paged)
        macs[shared] = ascendc_emu.last_run_stats()["preprocess"]["cube_macs"]
    # 4 sequences x 4 blocks x 2 kv heads, of which 2 blocks x 3 sequences are shared
    assert macs[2] * 16 == macs[0] * (16 - 2 * 3)


# --------------------------------------------------------------------------- decode with split kv


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
def test_decode_splits_long_contexts_across_cores(algorithm):
    """Decode with stacked GQA heads and 16 to 32 kv blocks per task on 24 AI Cores: the host
    splits each task's kv range (kv_splits > 1), the merge kernel joins the splits by their LSE
    in fp32. fa-fp32 and pasa-exact (fp32 statistics) stay within the dense bounds of the torch
    backend. pasa restarts its fp16 statistics (the running maximum and the pseudo-average)
    in each range, so it no longer rounds step for step as the sequential torch backend does:
    bounded instead against the fp64 golden: its output's relative error and its LSE's largest
    error each within 1.1x the torch backend's."""
    case = dict(layout="BSH", B=2, Nq=8, Nkv=2, S1=1, S2=4096, D=64, kv_lens=[4096, 2100])
    q, k, v, kw = make_case(case, torch.float16)
    out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
    stats = ascendc_emu.last_run_stats()
    assert stats["tiling"]["kv_splits"] > 1
    ref, ref_lse = torch_reference(q, k, v, stats["tiling"], algorithm=algorithm, **kw)
    if algorithm != "pasa":
        assert_matches_torch(out, lse, ref, ref_lse, algorithm, torch.float16)
        return
    gold, gold_lse = pasa_npu.reference_attention(q, k, v, **kw)
    err = float((out.double() - gold).norm() / gold.norm())
    ref_err = float((ref.double() - gold).norm() / gold.norm())
    assert torch.isfinite(out).all() and err <= 1.1 * ref_err, (err, ref_err)
    lse_err = float((lse.double() - gold_lse).abs().max())
    ref_lse_err = float((ref_lse.double() - gold_lse).abs().max())
    assert lse_err <= 1.1 * ref_lse_err, (lse_err, ref_lse_err)


# --------------------------------------------------------------------------- vector chunks


def _run_whole_and_chunked(run):
    """(out, lse, tiling) of ``run()`` with the vector cores on all their rows at once, then
    16 rows at a time."""
    results = []
    for chunk in (0, 16):
        with ascendc_emu.forcing_tiling(vec_chunk_rows=chunk):
            out, lse = run()
        results.append((out.clone(), lse.clone(), ascendc_emu.last_run_stats()["tiling"]))
    return results


@pytest.mark.parametrize("algorithm", KERNEL_ALGORITHMS)
@pytest.mark.parametrize("kind", ["paged-prefill", "split-decode", "sinks"])
def test_vector_chunks_change_no_bit_where_serving_calls(kind, algorithm):
    """Vector cores working on their rows 16 at a time give every output and LSE bit of
    working on all at once: prefill through a block table (a shared prefix block, sparse mode
    3), decode with 64 stacked query heads split across AI Cores (each split's partial rows
    and LSE stored chunk by chunk, then merged), and a packed causal v2 call with learnable
    sinks on 2 AI Cores."""
    from _paged_problems import dense_problem, paged_problem
    from test_ascendc_emu import emulated_cores
    if kind == "paged-prefill":
        case, block_size, shared = PAGED_CASES["prefill-shared-prefix"]
        q, k, v, kw = make_case(case, torch.float16)

        def run():
            paged, _ = paged_problem(dense_problem(q, k, v, algorithm=algorithm, **kw), block_size,
                                     "BNSD", shared_prefix=shared)
            ascendc_emu.run(paged)
            return paged.out, paged.lse
    elif kind == "split-decode":
        case = dict(layout="BSH", B=2, Nq=128, Nkv=2, S1=1, S2=4096, D=64, kv_lens=[4096, 2100])
        q, k, v, kw = make_case(case, torch.float16)

        def run():
            return pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
    else:
        q_cum = kv_cum = [50, 250]
        q, k, v = (torch.randn(250, 4, 32, dtype=torch.float16) for _ in range(3))
        kw = dict(num_query_heads=4, num_key_value_heads=4, softmax_scale=32 ** -0.5, input_layout="TND",
                  actual_seq_qlen=q_cum, actual_seq_kvlen=kv_cum, return_softmax_lse=True, sparse_mode=3,
                  atten_mask=pasa_npu.compressed_causal_mask(), learnable_sink=torch.tensor([-1.0, 0.5, 2.0, 4.0]))

        def run():
            with emulated_cores(2):
                return pasa_npu.fused_attention_v2(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)
    (out, lse, whole), (out16, lse16, chunked) = _run_whole_and_chunked(run)
    assert chunked["vec_chunk_rows"] == 16 and chunked["vec_rows"] >= 32, chunked
    assert whole["vec_chunk_rows"] == whole["vec_rows"], whole
    assert (whole["kv_splits"] > 1) == (kind == "split-decode"), whole
    assert torch.equal(out.view(torch.int16), out16.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), lse16.view(torch.int32))
