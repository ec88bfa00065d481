"""The ``ascendc-sim`` backend: the AscendC kernels of ``ascend_kernels/`` on the
instruction-level simulator of ``ascend_kernels/sim``.

The kernel sources and the host launcher are compiled by g++ in the CPU-debug configuration of
Atlas A2 against Huawei's asc-devkit headers (:mod:`pasa_npu.sim_build`): every AscendC API call
the kernels make runs Huawei's own implementation, down to the instructions the simulator
executes (``ascend_kernels/sim/README.md``). A call is laid out as for ``ascendc-emu``
(:mod:`pasa_npu.ascendc_cpu`, the AI Cores of its ``model_parameters``) and runs the program
``ascend_kernels/sim/pasa_sim_main.cpp`` once, the tensors passed through files. The tiling
check before it is the emulation extension's (the same host sources), so the extension must be
built too.

The program is built on first use into ``pasa-ascendc-sim-program-<hash>`` of the temporary
directory, the hash taken over the C++ sources of ``ascend_kernels/``, under a file lock; that
needs a checkout, the headers and g++ (:func:`pasa_npu.sim_build.why_not`, which the backend
registry checks). Correct and slow: for tests; ``backend="auto"`` never picks it.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from typing import Optional

import numpy as np

from pasa_npu import _ascendc_emu  # the host's tiling; ImportError when the extension was not built
from pasa_npu import ascendc_cpu, sim_build
from pasa_npu.problem import AttentionProblem

__all__ = ["Both", "last_run_stats", "program", "run_attention", "unsupported_reason", "run"]

SOURCE = os.path.join(sim_build.SIM, "pasa_sim_main.cpp")
LENGTHS = ("q_lens", "kv_lens", "next_tokens", "pre_tokens", "q_starts", "kv_starts")
#: seconds one call may run before it counts as hung
CALL_TIMEOUT_S = 600

_last_stats: Optional[dict] = None
_built: dict = {}  # source hash -> program


def last_run_stats() -> Optional[dict]:
    """``{"tiling": {...}}`` of the last call, the host's tiling (the simulator counts nothing)."""
    return _last_stats


def _source_hash() -> str:
    """A hash of every C++ source of ascend_kernels/ (the program reaches into several of its
    folders, the emulation's timing table included) and of the build."""
    h = hashlib.sha256()
    kernels = os.path.join(sim_build.ROOT, "ascend_kernels")
    for base, dirs, files in os.walk(kernels):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".h", ".cpp")):
                path = os.path.join(base, name)
                h.update(os.path.relpath(path, kernels).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    with open(sim_build.__file__, "rb") as f:
        h.update(f.read())
    return h.hexdigest()[:16]


def program() -> str:
    """The attention program for the sources as they are, built when it is not yet; RuntimeError
    saying what is missing or what the compiler said."""
    import fcntl  # POSIX, as is the simulator

    reason = sim_build.why_not()
    if reason:
        raise RuntimeError(f"ascendc-sim cannot build its program: {reason}")
    key = _source_hash()
    if key not in _built:
        where = os.path.join(tempfile.gettempdir(), f"pasa-ascendc-sim-program-{key}")
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build per folder, across processes
            _built[key] = sim_build.build(SOURCE, os.path.join(where, "pasa_sim_attention"))
    return _built[key]


def run_attention(program_path, query, key, value, out, lse, lengths, params, mask=None,
                  block_table=None, key_slots=None, row_flags=None, sink=None,
                  timeout=CALL_TIMEOUT_S, launches=None) -> None:
    """One call of ``program_path`` with the arguments of ``pasa_npu._ascendc_emu.run_attention``;
    writes out, lse and row_flags in place. RuntimeError with the program's messages when it
    fails. ``launches``: a list that receives, per launch, the instruction-level model's report
    (``pasa_sim_main.cpp``'s timing.jsonl, timed with ``params["timing"]``)."""
    with tempfile.TemporaryDirectory(prefix="pasa-sim-call-") as d:
        with open(os.path.join(d, "params.txt"), "w") as f:
            for k, v in params.items():
                if not isinstance(v, dict):
                    f.write(f"{k} {float(v)!r}\n")
                elif k == "timing":  # the timing model's parameters
                    f.writelines(f"timing.{n} {float(x)!r}\n" for n, x in v.items())
        arrays = dict(query=query, key=key, value=value, out=out, lse=lse, mask=mask, block_table=block_table,
                      key_slots=key_slots, sink=sink, row_flags=row_flags)
        for name, a in arrays.items():
            if a is not None:
                np.ascontiguousarray(a).tofile(os.path.join(d, f"{name}.bin"))
        for name in LENGTHS:
            if name in lengths:
                np.ascontiguousarray(lengths[name], np.int32).tofile(os.path.join(d, f"{name}.bin"))
        proc = subprocess.run([program_path, d], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            text = f"{proc.stdout.strip()[-3000:]}\n{proc.stderr.strip()[-3000:]}".strip()
            raise RuntimeError(f"ascendc-sim: the simulator failed (exit status {proc.returncode}):\n{text}")
        for name, a in (("out", out), ("lse", lse), ("row_flags", row_flags)):
            if a is not None:
                a.reshape(-1).view(np.uint8)[:] = np.fromfile(os.path.join(d, f"{name}.bin"), np.uint8)
        if launches is not None:
            with open(os.path.join(d, "timing.jsonl")) as f:
                launches.extend(json.loads(line) for line in f if line.strip())


class Both:
    """A stand-in for the emulation's engine (``ascendc_emu._ascendc_emu``): each
    ``run_attention`` runs the emulation and the simulator on the same inputs; the caller gets
    the emulation's stats and the results (out, lse, row flags) of ``caller_gets`` ("emu" or
    "sim"). ``calls`` holds, per call, its params, both results as bytes and the simulator's
    per-launch reports."""

    def __init__(self, emu, program_path: str, caller_gets: str = "emu"):
        if caller_gets not in ("emu", "sim"):
            raise ValueError(f"caller_gets must be 'emu' or 'sim', got {caller_gets!r}")
        self._emu = emu
        self._program = program_path
        self._caller_gets = caller_gets
        self.calls: list = []

    def __getattr__(self, name):
        return getattr(self._emu, name)

    def run_attention(self, query, key, value, out, lse, lengths, params, mask=None, block_table=None,
                      key_slots=None, row_flags=None, sink=None):
        given = (out, lse, row_flags)
        copies = tuple(None if a is None else np.array(a, copy=True) for a in given)
        emu, sim = (given, copies) if self._caller_gets == "emu" else (copies, given)
        inputs = dict(mask=mask, block_table=block_table, key_slots=key_slots, sink=sink)
        stats = self._emu.run_attention(query, key, value, emu[0], emu[1], lengths, params, row_flags=emu[2],
                                        **inputs)
        launches: list = []
        run_attention(self._program, query, key, value, sim[0], sim[1], lengths, params, row_flags=sim[2],
                      launches=launches, **inputs)
        as_bytes = lambda arrays: [None if a is None else np.asarray(a).tobytes() for a in arrays]  # noqa: E731
        self.calls.append(dict(params=dict(params), emu=as_bytes(emu), sim=as_bytes(sim), launches=launches))
        return stats


class _Simulator:
    """The engine of :func:`pasa_npu.ascendc_cpu.run`: the extension's tiling, the program's launches."""

    @staticmethod
    def tiling(params, lengths):
        return _ascendc_emu.tiling(params, lengths)

    @staticmethod
    def run_attention(*args, **kwargs):
        run_attention(program(), *args, **kwargs)


def unsupported_reason(problem: AttentionProblem) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they lack."""
    return ascendc_cpu.unsupported_reason(problem, "ascendc-sim")


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the AscendC kernels on the simulator; writes out (and lse)."""
    global _last_stats
    _, tiling = ascendc_cpu.run(problem, _Simulator, "ascendc-sim")
    _last_stats = dict(tiling=tiling)
