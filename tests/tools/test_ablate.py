"""``tools/dev/ablate.py`` measures what it says: every candidate is a valid tuning of the
Triton backend and runs, and the plain FA2 baseline kernel computes attention."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import BACKENDS, device_kind, on_device, record
from _bounds import out_bound, row_scale_ulps, ulp

# Derived bounds (tests/_bounds.py, "derived bounds"); what they measure is recorded under
# "ablate" as information. A candidate against the torch backend's pasa-exact: the same
# allocation, so the output bound of Triton against the torch backend, in ulps of each
# row's scale. The plain FA2 kernel against fp64 softmax attention: its fp32 scores and
# statistics err by fp32 ulps, its fp16 P (the PV operand, not in l) by 2^-11 relative, which
# the normalised weights turn into at most 2^-11 max|v|, and its fp16 output by half an ulp.

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")


def _inputs(seq=48, heads=2, d=32):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, heads, seq, d, generator=gen).half() for _ in range(3))
    return q, k + 2.0, v


def test_every_candidate_is_a_tuning_of_the_triton_kernel():
    """Every row but the default and the plain baseline times the Triton prefill kernel
    under its own Tuning (validated when made)."""
    from pasa_npu.fallback.triton import tuning as triton_tuning
    from pasa_npu.tools.dev import ablate

    rows = ablate.candidates()
    tuned = [tuning for label, tuning, _ in rows if tuning is not None]
    assert len({label for label, _, _ in rows}) == len(rows)
    assert len(tuned) == len(rows) - 2 - len(ablate.PLAIN_CONFIGS)
    assert all(isinstance(t, triton_tuning.Tuning) and t.prefill == "triton" for t in tuned)
    assert {t.launch for t in tuned} >= set(ablate.CONFIGS)
    assert any(t.loops == 7 for t in tuned)


def test_a_candidate_runs_with_its_tuning():
    from pasa_npu.fallback.triton import tuning as triton_tuning
    from pasa_npu.tools.dev import ablate

    q, k, v = on_device("triton", *_inputs())
    label, tuning, call = next(row for row in ablate.candidates()
                               if row[1] is not None and row[1].row_constant == "in-kernel")
    with triton_tuning.using(tuning):
        out = call(q, k, v, True)
    ref = pasa_npu.fused_attention(*_inputs(), num_heads=2, input_layout="BNSD",
                                   scale=32 ** -0.5, algorithm="pasa-exact", backend="torch",
                                   sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())[0]
    out = out.cpu()
    assert torch.isfinite(out.float()).all()
    err = record("ablate", f"{device_kind('triton')}/{label}", row_scale_ulps(out, ref))
    assert err <= out_bound("pasa-exact", torch.float16, kv_blocks=1), (label, err)


@pytest.mark.parametrize("causal", [False, True])
def test_plain_fa2_baseline_is_attention(causal):
    from pasa_npu.tools.dev import ablate

    q, k, v = _inputs(seq=32, d=16)
    out = ablate.plain(*on_device("triton", q, k, v), causal, block_m=16, block_n=16, warps=1,
                       stages=1).cpu().double()
    s = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(32, 32, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    err = record("ablate", f"{device_kind('triton')}/plain causal={causal}",
                 float((out - ref).abs().max()))
    bound = (0.5 * ulp(ref.abs().max(), torch.float16) + 2.0 ** -11 * v.double().abs().max()
             + 2.0 ** -20 * ref.abs().max())  # the last: the fp32 steps, generously
    assert err <= float(bound), (err, float(bound))


def test_host_time_mode_runs_on_any_machine(capsys):
    from pasa_npu.tools.dev import ablate

    assert ablate.main(["--host-time"]) == 0
    assert "API host time per call" in capsys.readouterr().out
    assert pasa_npu.plans.PLANS == {}


def test_causal_timing_reuses_one_argument_plan():
    """The timed causal call passes one mask object, so every call after the first finds
    its plan: the timing is of the kernels, not of validating a new mask each call."""
    from pasa_npu.tools.dev import ablate

    q, k, v = on_device("triton", *_inputs())
    pasa_npu.plans.clear()
    for _ in range(3):
        ablate.ours("fa-fp32", q, k, v, causal=True)
    assert len(pasa_npu.plans.PLANS) == 1


def test_per_call_device_us_sums_each_kernel_over_the_calls():
    from types import SimpleNamespace

    from pasa_npu.tools.dev import ablate

    events = [SimpleNamespace(key="_shift_keys", self_device_time_total=86.0),
              SimpleNamespace(key="prefill_kernel", self_device_time_total=2000.0),
              SimpleNamespace(key="prefill_kernel", self_device_time_total=650.0),
              SimpleNamespace(key="cudaLaunchKernel", self_device_time_total=0.0),
              SimpleNamespace(key="void at::native::fill_kernel<4, float>(int, float)",
                              self_device_time_total=3.0)]
    assert ablate.per_call_device_us(events, 2) == {
        "_shift_keys": 43.0, "prefill_kernel": 1325.0, "at::native::fill_kernel": 1.5}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the profiler split "
                    "times device kernels")
def test_gpu_kernel_split_names_the_key_shift_pass_and_the_attention_kernel():
    from pasa_npu.tools.dev import ablate

    q, k, v = on_device("triton", *_inputs())  # cuda here
    call = lambda: ablate.ours("pasa-exact", q, k, v, False)  # noqa: E731
    times = ablate.kernel_times_us(call, calls=3)
    assert {"_shift_keys", "prefill_kernel"} <= set(times)
    # per call: profiling twice as many calls gives each kernel about the same time
    doubled = ablate.kernel_times_us(call, calls=6)
    assert set(doubled) == set(times)
    assert all(0.67 < doubled[name] / us < 1.5 for name, us in times.items()), (times, doubled)
    plain = ablate.kernel_times_us(lambda: ablate.ours("fa-fp32", q, k, v, False), calls=3)
    assert "prefill_kernel" in plain and "_shift_keys" not in plain  # no shift without PASA


def test_kernel_cost_lines_compare_each_kernel_and_the_sum():
    """``--check-kernels``' table: a kernel of one side only reads "-" on the other and
    counts its whole time as the change; the last line sums both sides."""
    from pasa_npu.tools.dev import ablate

    lines = ablate.kernel_cost_lines(on={"prefill_ws_kernel": 670.0, "repair_kernel": 3.0, "fill": 1.0},
                                     off={"prefill_ws_kernel": 660.0, "fill": 1.0})
    assert [line.split()[0] for line in lines] == ["prefill_ws_kernel", "repair_kernel", "fill", "all"]
    assert lines[0].split()[-2:] == ["+10.0", "us"]
    assert lines[1].split()[1:6] == ["off", "-", "us", "on", "3.0"]
    assert lines[1].split()[-2:] == ["+3.0", "us"]
    assert lines[2].split()[-2:] == ["+0.0", "us"]
    assert lines[3].split()[-3:] == ["+13.0", "us", "(+1.97%)"]


def test_check_kernels_prints_each_case_and_allocation_off_then_on(monkeypatch, capsys):
    """``--check-kernels`` on a machine without a GPU, its profiler split faked: the first
    split of each case and allocation is the unchecked call's."""
    from types import SimpleNamespace

    from pasa_npu.tools.dev import ablate

    splits = iter([{"prefill_ws_kernel": 100.0}, {"prefill_ws_kernel": 101.0, "repair_kernel": 2.0}] * 4)
    inputs = _inputs()
    monkeypatch.setattr(ablate.torch, "Generator",
                        lambda device: SimpleNamespace(manual_seed=lambda seed: None))
    monkeypatch.setattr(ablate, "_case_inputs", lambda *case: inputs)
    monkeypatch.setattr(ablate, "kernel_times_us", lambda fn, calls: next(splits))
    ablate._check_kernels(SimpleNamespace(no_decode=True, dims=[128], causal="yes"))
    out = capsys.readouterr().out
    # S = 4k and 16k (ablate.SHAPES at d = 128), each for pasa and pasa-exact
    assert out.count("prefill d=128 S=") == 4 and out.count("pasa-exact:") == 2
    assert out.count("+3.0 us (+3.00%)") == 4 and out.count("repair_kernel") == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the profiler split "
                    "times device kernels")
def test_gpu_only_the_checked_call_launches_the_repair():
    from pasa_npu.tools import bench
    from pasa_npu.tools.dev import ablate

    q, k, v = on_device("triton", *_inputs())  # cuda here
    times = {check: ablate.kernel_times_us(
        lambda check=check: bench.ours_call("pasa", None, q.shape[1], k.shape[1], q.shape[3],
                                            repair_overflow=check)(q, k, v, False, False),
        calls=3) for check in (False, True)}
    assert "repair_kernel" in times[True] and "repair_kernel" not in times[False]
    assert set(times[True]) - {"repair_kernel"} == set(times[False])  # no other launch added


def test_ncu_instructions_sums_each_kernels_launches():
    """``--check-instructions`` reads ncu's CSV: instructions per kernel name, its launches
    summed, thousands separators dropped, ncu's own messages skipped."""
    from pasa_npu.tools.dev import ablate

    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Section Name","Metric Name","Metric Unit","Metric Value"')
    def row(i, kernel, metric, value):
        return (f'"{i}","7","python3","host","{kernel}","1","7",'
                f'"Command line profiler metrics","{metric}","inst","{value}"')
    report = "\n".join([
        "==PROF== Connected to process 7", header,
        row(0, "_key_shift", ablate.INSTRUCTIONS, "1,024"),
        row(1, "prefill_ws_kernel", ablate.INSTRUCTIONS, "343,374,534"),
        row(2, "prefill_ws_kernel", "gpu__time_duration.sum", "9,999"),
        row(3, "prefill_ws_kernel", ablate.INSTRUCTIONS, "6"),
        "==PROF== Disconnected from process 7"])
    assert ablate.ncu_instructions(report) == {"_key_shift": 1024, "prefill_ws_kernel": 343374540}
    assert ablate.ncu_instructions("==PROF== Connected to process 7\n") == {}
