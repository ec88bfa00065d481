"""PASA attention calls on the instruction-level simulator (ascend_kernels/sim/pasa_sim_main.cpp).

``run_attention`` takes the arguments of ``pasa_npu._ascendc_emu.run_attention`` and writes
``out``, ``lse`` and ``row_flags`` in place, computed by the kernels compiled against the
asc-devkit headers (Huawei's implementation of every AscendC API) and the simulator.
``Both`` stands in for the ``_ascendc_emu`` module: each attention call runs on the emulation
and on the simulator, and the two results are recorded for comparison.
"""
from __future__ import annotations

import os
import subprocess
import tempfile

import numpy as np

from tools import sim_build

SOURCE = os.path.join(sim_build.SIM, "pasa_sim_main.cpp")
LENGTHS = ("q_lens", "kv_lens", "next_tokens", "pre_tokens", "q_starts", "kv_starts")


def build(out_dir: str) -> str:
    return sim_build.build(SOURCE, os.path.join(out_dir, "pasa_sim_attention"))


def run_attention(program, query, key, value, out, lse, lengths, params, mask=None, block_table=None,
                  key_slots=None, row_flags=None, sink=None, timeout=600):
    """One call on the simulator (``program`` from ``build``); out, lse, row_flags in place."""
    with tempfile.TemporaryDirectory(prefix="pasa-sim-call-") as d:
        with open(os.path.join(d, "params.txt"), "w") as f:
            for k, v in params.items():
                if k != "timing":
                    f.write(f"{k} {float(v)!r}\n")
        arrays = dict(query=query, key=key, value=value, out=out, lse=lse, mask=mask, block_table=block_table,
                      key_slots=key_slots, sink=sink, row_flags=row_flags)
        for name, a in arrays.items():
            if a is not None:
                np.ascontiguousarray(a).tofile(os.path.join(d, f"{name}.bin"))
        for name in LENGTHS:
            if name in lengths:
                np.ascontiguousarray(lengths[name], np.int32).tofile(os.path.join(d, f"{name}.bin"))
        proc = subprocess.run([program, d], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{proc.stdout.strip()[-3000:]}\n{proc.stderr.strip()[-3000:]}".strip())
        for name, a in (("out", out), ("lse", lse), ("row_flags", row_flags)):
            if a is not None:
                a.reshape(-1).view(np.uint8)[:] = np.fromfile(os.path.join(d, f"{name}.bin"), np.uint8)


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
        run_attention(self._program, query, key, value, copies[0], copies[1], lengths, params, mask=mask,
                      block_table=block_table, key_slots=key_slots, row_flags=copies[2], sink=sink)
        emu = [None if a is None else np.array(a).tobytes() for a in (out, lse, row_flags)]
        sim = [None if a is None else a.tobytes() for a in copies]
        self.calls.append(dict(params=dict(params), emu=emu, sim=sim))
        return stats
