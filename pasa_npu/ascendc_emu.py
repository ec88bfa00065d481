"""The ``ascendc-emu`` backend: the AscendC kernel sources of ``ascend_kernels/`` run on CPU.

The extension ``pasa_npu._ascendc_emu`` compiles the kernel files unchanged against the
project's emulation of the AscendC API (``ascend_kernels/emu/kernel_operator.h``): one cube
thread and two vector threads per AI Core, the real buffer budgets, alignment rules, queue
discipline, pipe and cross-core synchronisation checked. A call goes through the same host
launcher as the NPU build (``ascend_kernels/host/pasa_launcher.h``), with an emulated
runtime in place of ACL; :mod:`pasa_npu.ascendc_cpu` lays the call out, as for ``ascendc-sim``.
Nothing here has run on an NPU.

What the kernels implement is in :mod:`pasa_npu.kernel_inputs`; everything else raises
``NotImplementedError`` naming the feature.

Every call is also timed by the emulation's pipe-level model of an Atlas A2
(``ascend_kernels/TIMING_MODEL.md``) with the parameters of :mod:`pasa_npu.npu_params`
(``model_parameters``; ``using_model_parameters`` swaps them): ``last_run_stats()`` holds each
launch's modelled cycles, every pipe's busy time and the binding pipe. A model, not a
measurement.
"""
from __future__ import annotations

from typing import Optional

from pasa_npu import _ascendc_emu  # ImportError when the extension was not built
from pasa_npu import ascendc_cpu
from pasa_npu.ascendc_cpu import forcing_tiling, model_parameters, using_model_parameters
from pasa_npu.kernel_inputs import TILING_KEYS
from pasa_npu.problem import AttentionProblem

__all__ = ["TILING_KEYS", "forcing_tiling", "last_run_stats", "model_parameters",
           "using_model_parameters", "unsupported_reason", "run"]

#: pipes of the timing model, and the two chip-wide bandwidth bounds it also reports
PIPES = ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX")

_last_stats: Optional[dict] = None


def last_run_stats() -> Optional[dict]:
    """Counters and modelled timing of the last call: ``{"preprocess": {...} or None,
    "attention": {...}, "merge": {...} or None, "repair": {...} or None (a checked call's
    fa-fp32 repair launch), "tiling": {...}, "runtime_calls": [...]}``. Each launch holds bytes
    per path, cube and vector work, and the model's ``cycles``, ``time_us``,
    ``pipe_busy_cycles`` (busiest core's pipe), ``binding`` (the pipe, an AI Core's GM port
    ``"RD"``/``"WR"`` or the ``"L2"``/``"HBM"`` bandwidth with the most busy cycles, or ``"path"``
    when none comes near the AI Core's cycles: ``binding_resource``); ``runtime_calls`` lists
    the shared launcher's calls of the emulated runtime."""
    return _last_stats


#: a resource binds when its busy cycles reach this share of the slowest AI Core's cycles;
#: below it the AI Core's dependency chain (its critical path) is what binds
BINDING_SHARE = 0.9


def binding_resource(busy: dict, core_cycles: float) -> str:
    """The resource of ``busy`` (pipes, ``RD``/``WR`` ports, ``L2``/``HBM`` bounds) with the most
    cycles, or ``"path"`` when none reaches BINDING_SHARE of ``core_cycles``."""
    binding = max(busy, key=busy.get)
    return binding if busy[binding] >= BINDING_SHARE * core_cycles else "path"


def annotate_launch(stats: dict, params: dict) -> dict:
    """Add ``time_us`` and ``binding`` (and its busy cycles) to one launch's emulation stats."""
    busy = dict(stats["pipe_busy_cycles"])
    busy["RD"] = stats["core_read_bound_cycles"]
    busy["WR"] = stats["core_write_bound_cycles"]
    busy["L2"] = stats["l2_bound_cycles"]
    busy["HBM"] = stats["hbm_bound_cycles"]
    binding = binding_resource(busy, stats["core_cycles"])
    stats.update(time_us=stats["cycles"] / params["clock_mhz"], binding=binding,
                 binding_cycles=busy.get(binding, stats["core_cycles"]))
    return stats


def unsupported_reason(problem: AttentionProblem) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they lack."""
    return ascendc_cpu.unsupported_reason(problem, "ascendc-emu")


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the AscendC kernels under emulation; writes out (and lse)."""
    global _last_stats
    stats, _ = ascendc_cpu.run(problem, _ascendc_emu, "ascendc-emu")
    model = model_parameters()
    for launch in ("preprocess", "attention", "merge", "repair"):
        if stats[launch] is not None:
            annotate_launch(stats[launch], model)
    _last_stats = stats
