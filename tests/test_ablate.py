"""``tools/ablate.py`` measures what it says: every source variant still finds its text in
the Triton backend and runs, and the plain FA2 baseline kernel computes attention."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import BACKENDS, assert_measured, device_kind, on_device

# The variants' errors within 2x their measured values (tests/_measured.py, "ablate")
ABLATE_FACTOR = 2

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")


def _inputs(seq=48, heads=2, d=32):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, heads, seq, d, generator=gen).half() for _ in range(3))
    return q, k + 2.0, v


@pytest.mark.parametrize("name", ["P'V tile in fp32", "l from unrounded p", "c = 0"])
def test_every_variant_applies_and_runs(name, tmp_path):
    from pasa_npu.tools import ablate

    module = ablate.variant_module(name, str(tmp_path))
    q, k, v = on_device("triton", *_inputs())
    with ablate.backend_module(module, dict(row_constant="precomputed")):
        assert pasa_npu.api._PLANS == {}
        out = ablate.ours("pasa-exact", q, k, v, causal=True)
        assert pasa_npu.api.backends.resolve("triton", q.device).runner() is module.run
    ref = pasa_npu.fused_attention(*_inputs(), num_heads=2, input_layout="BNSD",
                                   scale=32 ** -0.5, algorithm="pasa-exact", backend="torch",
                                   sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())[0]
    out = out.cpu().float()
    assert torch.isfinite(out).all()
    if name != "c = 0":  # the timing-only variants change rounding, not the result's scale
        err = float((out - ref.float()).norm() / ref.float().norm())
        assert_measured(err, "ablate", f"{device_kind('triton')}/{name}", ABLATE_FACTOR)
    from pasa_npu.fallback import triton_attention
    assert pasa_npu.api.backends.resolve("triton", q.device).runner() is triton_attention.run


def test_a_variant_whose_text_is_gone_is_an_error(tmp_path, monkeypatch):
    from pasa_npu.tools import ablate

    monkeypatch.setitem(ablate.VARIANTS, "stale", ("no such text in the backend", ""))
    with pytest.raises(RuntimeError, match="no longer in"):
        ablate.variant_module("stale", str(tmp_path))


@pytest.mark.parametrize("causal", [False, True])
def test_plain_fa2_baseline_is_attention(causal):
    from pasa_npu.tools import ablate

    q, k, v = _inputs(seq=32, d=16)
    out = ablate.plain(*on_device("triton", q, k, v), causal, block_m=16, block_n=16, warps=1,
                       stages=1).cpu().double()
    s = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(32, 32, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    assert_measured(float((out - ref).abs().max()), "ablate",
                    f"{device_kind('triton')}/plain causal={causal}", ABLATE_FACTOR)


def test_host_time_mode_runs_without_a_gpu(capsys):
    from pasa_npu.tools import ablate

    assert ablate.main(["--host-time"]) == 0
    assert "API host time per call" in capsys.readouterr().out
    assert pasa_npu.api._PLANS == {}


def test_causal_timing_reuses_one_argument_plan():
    """The timed causal call passes one mask object, so every call after the first finds
    its plan: the timing is of the kernels, not of validating a new mask each call."""
    from pasa_npu.tools import ablate

    q, k, v = on_device("triton", *_inputs())
    pasa_npu.api._PLANS.clear()
    for _ in range(3):
        ablate.ours("fa-fp32", q, k, v, causal=True)
    assert len(pasa_npu.api._PLANS) == 1


def test_backend_module_fixes_the_loops_and_restores_them():
    """The "every kv-block loop compiled in" candidates really compile all three in, and
    leave the backend's own choice in place afterwards."""
    from pasa_npu.fallback import triton_attention
    from pasa_npu.tools import ablate

    chosen = triton_attention._block_loops
    q, k, v = on_device("triton", *_inputs())
    with ablate.backend_module(triton_attention, loops=7):
        assert triton_attention._block_loops(None, 32) == 7
        every = ablate.ours("pasa-exact", q, k, v, causal=False)
    assert triton_attention._block_loops is chosen
    assert torch.equal(every, ablate.ours("pasa-exact", q, k, v, causal=False))


def test_per_call_device_us_sums_each_kernel_over_the_calls():
    from types import SimpleNamespace

    from pasa_npu.tools import ablate

    events = [SimpleNamespace(key="_shift_keys", self_device_time_total=86.0),
              SimpleNamespace(key="_attention_fwd", self_device_time_total=2000.0),
              SimpleNamespace(key="_attention_fwd", self_device_time_total=650.0),
              SimpleNamespace(key="cudaLaunchKernel", self_device_time_total=0.0),
              SimpleNamespace(key="void at::native::fill_kernel<4, float>(int, float)",
                              self_device_time_total=3.0)]
    assert ablate.per_call_device_us(events, 2) == {
        "_shift_keys": 43.0, "_attention_fwd": 1325.0, "at::native::fill_kernel": 1.5}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the profiler split "
                    "times device kernels")
def test_kernel_split_names_the_key_shift_pass_and_the_attention_kernel():
    from pasa_npu.tools import ablate

    q, k, v = on_device("triton", *_inputs())  # cuda here
    times = ablate.kernel_times_us(lambda: ablate.ours("pasa-exact", q, k, v, False), calls=3)
    assert {"_shift_keys", "_attention_fwd"} <= set(times)
    assert all(us > 0 for us in times.values())
    plain = ablate.kernel_times_us(lambda: ablate.ours("fa-fp32", q, k, v, False), calls=3)
    assert "_attention_fwd" in plain and "_shift_keys" not in plain  # no shift without PASA
