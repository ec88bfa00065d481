"""Backend registry: which implementation computes a canonical problem.

A backend is a function ``run(problem) -> None`` that fills ``problem.out`` and
``problem.lse``. Each entry says whether it can run here and why not.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .problem import AttentionProblem


@dataclass(frozen=True)
class Backend:
    name: str
    module: str
    devices: tuple[str, ...]
    summary: str

    def unavailable_reason(self, device: torch.device) -> Optional[str]:
        """None when this backend can run on ``device``, else a sentence why not."""
        if device.type not in self.devices:
            return (f"backend {self.name!r} runs on {', '.join(self.devices)} tensors, "
                    f"got tensors on {device.type}")
        return None

    def runner(self) -> Callable[[AttentionProblem], None]:
        return importlib.import_module(self.module).run


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("torch", "pasa_npu.fallback.torch_blockwise", ("cpu", "cuda"),
                "blockwise PyTorch emulation of every allocation (CPU reference backend)"),
        Backend("ascendc-emu", "pasa_npu.ascendc_emu", ("cpu",),
                "the AscendC kernels of ascend_kernels/ run on CPU against the emulated AscendC API"),
    )
}

#: Names accepted by ``backend=``, implemented or planned.
BACKEND_NAMES = ("auto", "torch", "triton", "ascendc-emu", "npu")


def resolve(name: str, device: torch.device) -> Backend:
    """Pick the backend for ``backend=name`` and tensors on ``device``."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {name!r}")
    if name == "auto":
        name = "torch"
    backend = BACKENDS.get(name)
    if backend is None:
        raise NotImplementedError(f"backend {name!r} is not implemented yet; available: "
                                  f"{sorted(BACKENDS)}")
    reason = backend.unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(reason)
    return backend


def available_backends(device: str = "cpu") -> list[str]:
    """Names of the backends that can run on ``device`` in this environment."""
    names = []
    for name, backend in BACKENDS.items():
        if backend.unavailable_reason(torch.device(device)) is None:
            try:
                backend.runner()
            except ImportError:
                continue
            names.append(name)
    return names


def run_golden(problem: AttentionProblem) -> None:
    importlib.import_module("pasa_npu.fallback.golden").run(problem)
