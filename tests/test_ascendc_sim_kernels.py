"""The PASA kernels on the instruction-level simulator: every AscendC API they call runs
Huawei's implementation (the asc-devkit headers, CPU-debug build) down to the simulated
instructions. Each call of the golden matrix runs on the emulation (ascendc-emu, itself held
against the torch backend by test_ascendc_emu.py) and on the simulator, and the two results must
be the same bytes: out, LSE and the row flags."""
from __future__ import annotations

import numpy as np
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


class Both:
    """A stand-in for the ``_ascendc_emu`` module: ``run_attention`` runs the emulation (whose
    results the caller gets) and the simulator on copies of the same arrays; ``calls`` holds, per
    call, the params and the two results (out, lse, row_flags) as bytes."""

    def __init__(self, emu_module, program):
        self._emu = emu_module
        self._program = program
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._emu, name)

    def run_attention(self, query, key, value, out, lse, lengths, params, mask=None, block_table=None,
                      key_slots=None, row_flags=None, sink=None):
        copies = [np.array(a, copy=True) if a is not None else None for a in (out, lse, row_flags)]
        stats = self._emu.run_attention(query, key, value, out, lse, lengths, params, mask=mask,
                                        block_table=block_table, key_slots=key_slots, row_flags=row_flags,
                                        sink=sink)
        ascendc_sim.run_attention(self._program, query, key, value, copies[0], copies[1], lengths, params,
                                  mask=mask, block_table=block_table, key_slots=key_slots, row_flags=copies[2],
                                  sink=sink)
        emu = [None if a is None else np.array(a).tobytes() for a in (out, lse, row_flags)]
        sim = [None if a is None else a.tobytes() for a in copies]
        self.calls.append(dict(params=dict(params), emu=emu, sim=sim))
        return stats


@pytest.fixture
def both(monkeypatch):
    proxy = Both(ascendc_emu._ascendc_emu, ascendc_sim.program())
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
