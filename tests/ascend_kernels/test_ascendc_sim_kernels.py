"""The PASA kernels on the instruction-level simulator: every AscendC API they call runs
Huawei's implementation (the asc-devkit headers, CPU-debug build) down to the simulated
instructions. Each call of the golden matrix runs on the emulation (ascendc-emu, itself held
against the torch backend by test_ascendc_emu.py) and on the simulator, and the two results must
be the same bytes: out, LSE and the row flags."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import SIM, SIM_ABSENT, sim_cores

if SIM_ABSENT is not None:
    pytest.skip(SIM_ABSENT, allow_module_level=True)

from pasa_npu import ascendc_emu, ascendc_sim  # noqa: E402
from test_golden import CASES, make_case  # noqa: E402
from test_ascendc_emu import kernels_support  # noqa: E402

ALGORITHMS = ("fa-fp32", "pasa", "pasa-exact")


@pytest.fixture
def both(monkeypatch):
    proxy = ascendc_sim.Both(ascendc_emu._ascendc_emu, ascendc_sim.program())
    monkeypatch.setattr(ascendc_emu, "_ascendc_emu", proxy)
    with sim_cores(SIM):  # every AI Core walks several tasks, as at real shapes
        yield proxy


def _run(q, k, v, algorithm, kw):
    pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="ascendc-emu", **kw)


def _assert_same(proxy):
    assert proxy.calls, "the call did not reach the kernels"
    for call in proxy.calls:
        for name, e, s in zip(("out", "lse", "row_flags"), call["emu"], call["sim"]):
            assert (e is None) == (s is None), name
            if e is not None and e != s:
                diff = sum(a != b for a, b in zip(e, s))
                raise AssertionError(f"{name}: {diff} of {len(e)} bytes differ between ascendc-sim and ascendc-emu")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", list(CASES))
def test_golden_matrix_is_bit_identical_to_the_emulation(both, name, algorithm):
    case = CASES[name]
    if not kernels_support(case, algorithm):
        pytest.skip("the kernels refuse this case (test_ascendc_emu.py checks how)")
    q, k, v, kw = make_case(case, torch.float16)
    kw["repair_overflow"] = False
    _run(q, k, v, algorithm, kw)
    _assert_same(both)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bfloat16_and_checked_rows(both, algorithm):
    q, k, v, kw = make_case(CASES["right-down-ragged"], torch.bfloat16)
    _run(q, k, v, algorithm, kw)
    _assert_same(both)
