"""Backend registry: which implementation computes a canonical problem.

A backend is a function ``run(problem) -> None`` that fills ``problem.out`` and
``problem.lse``. Its module may also define ``repeat(plan_state, tensors) -> bool``: the
launches ``run`` recorded in ``problem.plan_state`` for a plan's first call, repeated on a
later call's own tensors (:func:`~pasa_npu.problem.call_tensors`), False where it cannot,
launching nothing; it is asked only once ``run`` has put something in the plan's state.
Each entry says whether it can run here and why not.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .problem import AttentionProblem


@dataclass(frozen=True)
class Backend:
    """``devices``: device types it runs on; ``emulated_on``: those where it runs only
    through an emulator (correct, slow, meant for tests; never a default), which
    ``emulator_switch`` (an environment variable set to 1), if any, must turn on. Every
    backend flags and repairs the non-finite rows of a PASA allocation itself
    (:mod:`pasa_npu.overflow`). ``backward``: its outputs carry autograd (PyTorch operations
    throughout); a backend without refuses inputs that require grad. ``sinks``: it computes
    learnable sinks; the others refuse ``learnable_sink``. ``requires``: a module whose
    ``why_not()`` names what the backend needs and does not find here (None when it finds
    everything)."""

    name: str
    module: str
    devices: tuple[str, ...]
    summary: str
    emulated_on: tuple[str, ...] = ()
    emulator_switch: Optional[str] = None
    backward: bool = False
    sinks: bool = False  # computes learnable sinks (AttentionProblem.sink)
    requires: Optional[str] = None

    def unavailable_reason(self, device: torch.device) -> Optional[str]:
        """None when this backend can run on ``device``, else a sentence why not."""
        if device.type not in self.devices:
            return (f"backend {self.name!r} runs on {', '.join(self.devices)} tensors, "
                    f"got tensors on {device.type}")
        if (device.type in self.emulated_on and self.emulator_switch
                and os.environ.get(self.emulator_switch, "0") != "1"):
            native = [d for d in self.devices if d not in self.emulated_on]
            return (f"backend {self.name!r} runs on {', '.join(native)} tensors, and on "
                    f"{device.type} tensors only through its emulator: set "
                    f"{self.emulator_switch}=1 before importing it")
        if self.requires:
            missing = importlib.import_module(self.requires).why_not()
            if missing:
                return f"backend {self.name!r} cannot run here: {missing}"
        return None

    def runner(self) -> Callable[[AttentionProblem], None]:
        return importlib.import_module(self.module).run

    def repeater(self) -> Optional[Callable[[dict, dict], bool]]:
        """The module's ``repeat`` (module docstring), or None where it has none."""
        return getattr(importlib.import_module(self.module), "repeat", None)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("torch", "pasa_npu.fallback.torch.blockwise", ("cpu", "cuda"),
                "blockwise PyTorch emulation of every allocation (CPU reference backend)",
                backward=True, sinks=True),
        Backend("triton", "pasa_npu.fallback.triton.attention", ("cuda", "cpu"),
                "Triton kernels for CUDA GPUs; on CPU tensors under TRITON_INTERPRET=1",
                emulated_on=("cpu",), emulator_switch="TRITON_INTERPRET", sinks=True),
        Backend("ascendc-emu", "pasa_npu.ascendc_emu", ("cpu",),
                "the AscendC kernels of ascend_kernels/ run on CPU against the emulated AscendC API",
                emulated_on=("cpu",), sinks=True),
        Backend("ascendc-sim", "pasa_npu.ascendc_sim", ("cpu",),
                "the AscendC kernels of ascend_kernels/ run on CPU against Huawei's AscendC "
                "implementation (the asc-devkit headers) on an instruction-level simulator",
                emulated_on=("cpu",), sinks=True, requires="pasa_npu.sim_build"),
        Backend("npu", "pasa_npu.npu", ("npu",),
                "the AscendC kernels of ascend_kernels/ on an Ascend NPU through torch_npu",
                sinks=True),
    )
}

#: Names accepted by ``backend=``.
BACKEND_NAMES = ("auto", *BACKENDS)


def resolve(name: str, device: torch.device) -> Backend:
    """Pick the backend for ``backend=name`` and tensors on ``device``."""
    check_name(name)
    if name == "auto":
        if device.type == "npu":
            name = "npu"
        else:
            name = "triton" if device.type == "cuda" and _importable("triton") else "torch"
    backend = BACKENDS[name]
    reason = backend.unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(reason)
    return backend


def check_name(name: str) -> None:
    """Refuse a ``backend=`` that names no backend (ValueError)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {name!r}")


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available_backends(device: str = "cpu", emulated: bool = False) -> list[str]:
    """Names of the backends that can run on ``device`` in this environment.

    ``emulated``: also those that run here only through an emulator (Triton's CPU
    interpreter, the AscendC emulation and simulator): correct but slow, for tests and
    explicit requests; never picked by default.
    """
    try:
        dev = torch.device(device)
    except RuntimeError:  # a device type this torch does not know (npu without torch_npu)
        return []
    names = []
    for name, backend in BACKENDS.items():
        if backend.unavailable_reason(dev) is not None:
            continue
        if not emulated and dev.type in backend.emulated_on:
            continue
        try:
            backend.runner()
        except ImportError:
            continue
        names.append(name)
    return names


def run_golden(problem: AttentionProblem) -> None:
    importlib.import_module("pasa_npu.reference").run(problem)
