"""Every alternative of the Triton backend's Tuning switches computes the same
allocation: the warp-specialised Gluon prefill vs the Triton kernel, TMA vs pointer
loads, pasa-exact's row constant precomputed vs in the kernel, PASA's key shift as a
separate pass vs fused. Each is checked against the CPU backend on a case with GQA, a
causal band, ragged lengths and a packed layout (whose TMA descriptors address the batch
axis differently); the prefill switch without the ragged lengths in BNSD, which the Gluon
kernel does not cover. Decode's shift on the scores vs on the keys on a decode case, and
decode's TMA vs pointer loads bit for bit over contiguous, packed and paged layouts."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import BACKENDS, interpreted, on_device, triton_tuning
from _bounds import assert_triton_matches_cpu, triton_numerics

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")

SWITCHES = [("prefill", "warp-specialised"), ("prefill", "triton"), ("loads", "pointers"),
            ("loads", "tma"), ("row_constant", "precomputed"), ("row_constant", "in-kernel"),
            ("shift", "fused"), ("shift", "separate"), ("shift", "in-launch")]
DECODE_SWITCHES = [("decode_shift", "scores"), ("decode_shift", "keys")]


def _case(layout: str, ragged: bool = True):
    gen = torch.Generator().manual_seed(11)
    s1, s2, d = (40, 72, 64) if interpreted("triton") else (300, 520, 128)
    if layout == "TND":
        q = torch.randn(2 * s1, 4, d, generator=gen)
        kv = [torch.randn(2 * s2, 2, d, generator=gen) + 3.0 for _ in range(2)]
        kw = dict(input_layout="TND", actual_seq_lengths=[s1 - 7, 2 * s1],
                  actual_seq_lengths_kv=[s2 - 5, 2 * s2])
    else:
        q = torch.randn(2, 4, s1, d, generator=gen)
        kv = [torch.randn(2, 2, s2, d, generator=gen) + 3.0 for _ in range(2)]
        kw = dict(input_layout="BNSD", actual_seq_lengths_kv=[s2, s2 - 9] if ragged else None)
    kw.update(num_heads=4, num_key_value_heads=2, scale=d ** -0.5, sparse_mode=3,
              atten_mask=pasa_npu.compressed_causal_mask(), kv_block=32 if interpreted("triton")
              else 128, softmax_lse_flag=True)
    return [t.half() for t in (q, *kv)], kw


@pytest.mark.parametrize("layout", ["BNSD", "TND"])
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("switch,value", SWITCHES)
def test_tuning_alternatives_agree_with_cpu_backend(switch, value, algorithm, layout):
    (q, k, v), kw = _case(layout, ragged=switch != "prefill")
    ref, ref_lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="torch", **kw)
    qd, kd, vd = on_device("triton", q, k, v)
    kw_dev = dict(kw, atten_mask=kw["atten_mask"].to(qd.device))
    with triton_tuning(**{switch: value}):
        out, lse = pasa_npu.fused_attention(qd, kd, vd, algorithm=algorithm, backend="triton",
                                            **kw_dev)
    cum = kw.get("actual_seq_lengths_kv")
    lens = ((cum or [k.shape[-2]]) if layout == "BNSD"
            else [b - a for a, b in zip([0, *cum], cum)])
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"{layout}-{switch}={value}",
                              call=(q, k, v, kw), kv_lens=lens, kv_block=kw["kv_block"])


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "pasa-mixed"])
@pytest.mark.parametrize("switch,value", DECODE_SWITCHES)
def test_decode_tuning_alternatives_agree_with_cpu_backend(switch, value, algorithm):
    """Decode (query length 1, GQA 4:1, several kv blocks and a part-filled last one, two
    lengths): each shift against the CPU backend computing the same shift."""
    gen = torch.Generator().manual_seed(12)
    s2, d, block = (72, 64, 16) if interpreted("triton") else (1000, 128, 128)
    q = torch.randn(2, 8, 1, d, generator=gen).half()
    k, v = (torch.randn(2, 2, s2, d, generator=gen).half() + 3.0 for _ in range(2))
    kw = dict(num_heads=8, num_key_value_heads=2, input_layout="BNSD", scale=d ** -0.5,
              kv_block=block, actual_seq_lengths_kv=[s2, s2 // 2 + 3], softmax_lse_flag=True,
              algorithm=algorithm)
    with triton_tuning(**{switch: value}):
        with triton_numerics("decode"):
            ref, ref_lse = pasa_npu.fused_attention(q, k, v, backend="torch", **kw)
        out, lse = pasa_npu.fused_attention(*on_device("triton", q, k, v), backend="triton",
                                            **kw)
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"decode-{switch}={value}",
                              path="decode", call=(q, k, v, kw),
                              kv_lens=kw["actual_seq_lengths_kv"], kv_block=block)


LOOP_CASES = {  # name: (extra arguments, kv length, expected kv-block loops)
    "full": (dict(), 64, 2),
    "ragged kv": (dict(), 72, 2 | 4),
    "causal": (dict(sparse_mode=3), 64, 2 | 4),
    "band": (dict(sparse_mode=4, pre_tokens=20, next_tokens=0), 64, 1 | 2 | 4),
    "left edge only": (dict(sparse_mode=4, pre_tokens=20, next_tokens=1000), 64, 1 | 2),
    "explicit mask": (dict(sparse_mode=0), 64, 1),
}


@pytest.mark.parametrize("case", list(LOOP_CASES))
def test_block_loops_compiled_out_only_where_empty(case, monkeypatch):
    """The prefill kernel compiles out the kv-block loops a problem can never enter. The
    output with only those loops must equal, bit for bit, the output with all three."""
    from pasa_npu.fallback.triton import launch as triton_launch

    extra, s2, expected = LOOP_CASES[case]
    gen = torch.Generator().manual_seed(5)
    s1, d = 40, 64
    q, k, v = (torch.randn(1, 2, s, d, generator=gen).half() for s in (s1, s2, s2))
    kw = dict(num_heads=2, input_layout="BNSD", scale=d ** -0.5, kv_block=32,
              algorithm="pasa-exact", **extra)
    if kw.get("sparse_mode") in (3, 4):
        kw["atten_mask"] = pasa_npu.compressed_causal_mask()
    if case == "explicit mask":
        kw["atten_mask"] = torch.rand(1, s1, s2, generator=gen) < 0.3
    q, k, v = on_device("triton", q, k, v)
    if "atten_mask" in kw:
        kw["atten_mask"] = on_device("triton", kw["atten_mask"])[0]

    chosen = []
    block_loops = triton_launch.block_loops
    monkeypatch.setattr(triton_launch, "block_loops",
                        lambda *a: chosen.append(block_loops(*a)) or chosen[-1])
    out = pasa_npu.fused_attention(q, k, v, backend="triton", **kw)[0]
    assert chosen == [expected]
    with triton_tuning(loops=7):
        every_loop = pasa_npu.fused_attention(q, k, v, backend="triton", **kw)[0]
    assert chosen == [expected]  # the tuning's loops replace the heuristic's
    assert torch.equal(out, every_loop)
    assert torch.isfinite(out.float()).all()


def test_every_tuning_choice_is_tested_and_bad_ones_are_refused(capsys):
    """Each switch's choices are the ones the tests above run (``auto`` picks one of the
    others); Tuning and pasa-bench refuse a key or value the backend does not know, instead
    of running the default under a wrong label."""
    from pasa_npu.fallback.triton import tuning as tuning_module
    from pasa_npu.tools import bench

    choices = tuning_module.CHOICES
    default = tuning_module.DEFAULT_TUNING
    assert all(getattr(default, key) == values[0] for key, values in choices.items())
    tested = {(key, value) for key, values in choices.items() for value in values
              if value != "auto"}
    assert tested == set(SWITCHES) | set(DECODE_SWITCHES)
    # every other choice belongs to the Triton kernel (the in-launch shift to the Gluon
    # one): set away from its default, it sends an "auto" prefill there
    # (tests/fallback/gluon/test_gluon_prefill.py checks that on a Hopper GPU)
    assert not default.triton_kernel_only()
    for key, values in choices.items():
        for value in values[1:]:
            assert default.replace(**{key: value}).triton_kernel_only() == (
                key not in ("prefill", "decode_shift") and value != "in-launch")
    assert default.replace(loops=7).triton_kernel_only()
    assert default.replace(launch=(64, 4, 2)).triton_kernel_only()
    with pytest.raises(ValueError, match="Tuning.shift must be one of"):
        default.replace(shift="foo")
    with pytest.raises(ValueError, match="Tuning.loops must be None or 1-7"):
        default.replace(loops=8)
    with pytest.raises(TypeError, match="tuning must be a Tuning"):
        with tuning_module.using({"shift": "fused"}):
            pass
    for bad in ("shift=foo", "rowsum_mma=0", "loads"):
        assert bench.main(["--tuning", bad]) == 2
        assert f"--tuning '{bad}' is not one of" in capsys.readouterr().err


def test_tuning_is_active_in_its_block_only():
    from pasa_npu.fallback.triton import tuning as tuning_module

    assert tuning_module.active() is tuning_module.DEFAULT_TUNING
    with triton_tuning(shift="fused"):
        assert tuning_module.active().shift == "fused"
    assert tuning_module.active() is tuning_module.DEFAULT_TUNING


def _decode_case(layout: str):
    """(q, k, v, kw) of a decode call with several whole kv blocks and a part-filled last
    one: contiguous in ``layout``, or "paged 4d" / "paged 3d" (cache blocks of 128 keys,
    each holding whole kv blocks)."""
    from _paged import PAGED_CASES, paged_case

    block = 32 if interpreted("triton") else 128
    if layout.startswith("paged"):
        case = dict(PAGED_CASES["decode-bnsd-4d"], cache=layout.split()[1])
        q, k, v, kw, _ = paged_case(case, torch.float16, seed=13)
        return q, k, v, dict(kw, kv_block=block)
    gen = torch.Generator().manual_seed(13)
    d, lens = 64, [5 * block + 7, 3 * block]
    kw = dict(num_heads=8, num_key_value_heads=2, input_layout=layout, scale=d ** -0.5,
              kv_block=block, softmax_lse_flag=True)
    if layout == "TND":
        q = torch.randn(2, 8, d, generator=gen).half()
        k, v = (torch.randn(sum(lens), 2, d, generator=gen).half() + 2.0 for _ in range(2))
        return q, k, v, dict(kw, actual_seq_lengths=[1, 2],
                             actual_seq_lengths_kv=[lens[0], sum(lens)])
    q = torch.randn(2, 8, 1, d, generator=gen).half()
    k, v = (torch.randn(2, 2, max(lens), d, generator=gen).half() + 2.0 for _ in range(2))
    if layout == "BSND":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q, k, v, dict(kw, actual_seq_lengths_kv=lens)


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("layout", ["BNSD", "BSND", "TND", "paged 4d", "paged 3d"])
def test_decode_reads_whole_blocks_through_tma_bit_for_bit_as_through_pointers(layout,
                                                                               algorithm):
    """Decode's whole kv blocks read through TMA descriptors (contiguous layouts; packed
    TND, whose descriptors never step the batch axis; paged caches whose blocks hold
    whole kv blocks) give the bits that pointer loads give, the part-filled last block
    and the merge included; and the TMA launch really takes the descriptors."""
    from pasa_npu.fallback import kernel_common

    q, k, v, kw = _decode_case(layout)
    args = on_device("triton", q, k, v)
    if not kernel_common.tma_capable(args[0].device):
        pytest.skip("TMA loads need a Hopper or newer GPU (or Triton's interpreter); this GPU "
                    "is older")
    table = kw.get("block_table")
    if table is not None:
        kw = dict(kw, block_table=on_device("triton", table)[0])
    results, used = {}, []
    launch = kernel_common.Binding.launch

    def spy(self, kernel, grid, *a, **options):
        used.append(options.get("USE_TMA"))
        return launch(self, kernel, grid, *a, **options)

    for loads in ("pointers", "tma"):
        pasa_npu.plans.clear()
        with triton_tuning(loads=loads), pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernel_common.Binding, "launch", spy)
            results[loads] = pasa_npu.fused_attention(*args, backend="triton",
                                                      algorithm=algorithm, **kw)
    assert used == [False, True]
    for tma, pointers in zip(results["tma"], results["pointers"]):
        assert torch.equal(tma.isnan(), pointers.isnan())
        assert torch.equal(tma.nan_to_num(), pointers.nan_to_num())
