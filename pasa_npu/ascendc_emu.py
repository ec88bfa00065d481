"""The ``ascendc-emu`` backend: the AscendC kernel sources of ``ascend_kernels/`` run on CPU.

The extension ``pasa_npu._ascendc_emu`` compiles the kernel files unchanged against the
project's emulation of the AscendC API (``ascend_kernels/emu/kernel_operator.h``): one cube
thread and two vector threads per AI Core, the real buffer budgets, alignment rules, queue
discipline, pipe and cross-core synchronisation checked. A call goes through the same host
launcher as the NPU build (``ascend_kernels/host/pasa_launcher.h``), with an emulated
runtime in place of ACL. Nothing here has run on an NPU.

What the kernels implement is in :mod:`pasa_npu.kernel_inputs`; everything else raises
``NotImplementedError`` naming the feature.

Every call is also timed by the emulation's pipe-level model of an Atlas A2
(``ascend_kernels/TIMING_MODEL.md``) with the parameters of :mod:`pasa_npu.npu_params`
(``model_parameters``; ``using_model_parameters`` swaps them): ``last_run_stats()`` holds each
launch's modelled cycles, every pipe's busy time and the binding pipe. A model, not a
measurement.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch

from pasa_npu import _ascendc_emu  # ImportError when the extension was not built
from pasa_npu import npu_params
from pasa_npu.kernel_inputs import TILING_KEYS, BNSD, kernel_call
from pasa_npu.kernel_inputs import unsupported_reason as _kernel_unsupported_reason
from pasa_npu.numerics import RESOLUTION_LIMIT
from pasa_npu.problem import AttentionProblem

__all__ = ["TILING_KEYS", "last_run_stats", "model_parameters",
           "using_model_parameters", "unsupported_reason", "run"]

#: seconds a cross-core wait may block before the emulation reports a hang
WAIT_TIMEOUT_S = 60.0
#: pipes of the timing model, and the two chip-wide bandwidth bounds it also reports
PIPES = ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX")

_last_stats: Optional[dict] = None
_model = npu_params.values()


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


def model_parameters() -> dict:
    """The NPU model parameters the next call uses (core_num included: the host tiles for it)."""
    return dict(_model)


@contextlib.contextmanager
def using_model_parameters(params: dict) -> Iterator[None]:
    """Run the calls inside with ``params`` (a full table, e.g. ``npu_params.corner("slow")``)."""
    global _model
    missing = sorted(set(npu_params.values()) - set(params))
    if missing:
        raise ValueError(f"NPU model parameters missing: {missing}")
    saved, _model = _model, dict(params)
    try:
        yield
    finally:
        _model = saved


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
    reason = _kernel_unsupported_reason(problem, "ascendc-emu")
    if reason is None and problem.query.device.type != "cpu":
        return "the ascendc-emu backend runs on CPU tensors"
    return reason


def _memory(t: torch.Tensor, layout: int):
    """The int16 numpy array of a (B, N, S, D) view in its memory order (no copy)."""
    return (t if layout == BNSD else t.permute(0, 2, 1, 3)).view(torch.int16).numpy()


def mask_params(mask: Optional[torch.Tensor]) -> dict:
    """The tiling's mask fields for the uint8 (B|1, S1, S2) mask bytes (or None)."""
    if mask is None:
        return dict(has_mask=0)
    row = mask.stride(1) if mask.shape[1] > 1 else mask.shape[2]
    return dict(has_mask=1, mask_row_stride=row, mask_batch_stride=mask.stride(0) if mask.shape[0] > 1 else 0)


def paged_params(call) -> dict:
    """The tiling's paged fields: the caches' blocks, the table's width, the block size."""
    if call.block_table is None:
        return dict(paged=0)
    return dict(paged=1, block_size=call.key.shape[2], table_stride=call.block_table.shape[1],
                num_blocks=call.key.shape[0])


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the AscendC kernels under emulation; writes out (and lse)."""
    global _last_stats
    reason = unsupported_reason(problem)
    if reason is not None:
        raise NotImplementedError(reason)
    call = kernel_call(problem)
    batch, n_q, s_q, d = call.query.shape
    n_kv, s_kv, d_v = call.key.shape[1], call.key.shape[2], call.value.shape[3]
    lse = call.lse if call.lse is not None else torch.full((batch, n_q, s_q), -math.inf)
    flags = None
    if problem.overflow is not None:  # the kernels flag the rows they write; rows outside read 0
        flags = problem.overflow.row_flags
        flags.zero_()
    params = dict(
        tiling_key=call.tiling_key, batch=problem.batch, num_heads=n_q, num_kv_heads=n_kv,
        seq_q=s_q, seq_kv=s_kv, head_dim=d, head_dim_v=d_v, q_layout=call.q_layout,
        kv_layout=call.kv_layout, out_layout=call.out_layout,
        out_dtype=0 if call.out.dtype == torch.float16 else 1,
        in_dtype=0 if call.query.dtype == torch.float16 else 1, mask_mode=call.mask_mode,
        packed=int(problem.packed), overflow_check=int(flags is not None), has_sink=int(call.sink is not None),
        resolution_limit=RESOLUTION_LIMIT,  # checked pasa / pasa-exact rows: the resolution check too
        **mask_params(call.mask),
        **paged_params(call),
        scale=float(problem.scale), beta=float(problem.beta), q_tile=problem.tiling.q_block,
        kv_block=problem.tiling.kv_block, core_num=int(_model["core_num"]), timeout_s=WAIT_TIMEOUT_S,
        timing=npu_params.timing_only(_model))
    lengths = {name: t.numpy() for name, t in call.lengths.items()}
    try:
        _ascendc_emu.tiling({k: v for k, v in params.items() if k != "timing"}, lengths)
    except ValueError as exc:  # a configuration the kernels cannot tile
        raise NotImplementedError(f"ascendc-emu: {exc}") from None
    mask = None
    if call.mask is not None:  # the bytes from the mask's first element on
        flat = call.mask.as_strided((call.mask.untyped_storage().nbytes() - call.mask.storage_offset(),),
                                    (1,), call.mask.storage_offset())
        mask = flat.numpy()
    stats = _ascendc_emu.run_attention(
        _memory(call.query, call.q_layout), _memory(call.key, call.kv_layout),
        _memory(call.value, call.kv_layout), _memory(call.out, call.out_layout), lse.numpy(),
        lengths, params, mask=mask,
        block_table=None if call.block_table is None else call.block_table.numpy(),
        key_slots=None if call.key_slots is None else call.key_slots.numpy(),
        row_flags=None if flags is None else flags.numpy(),
        sink=None if call.sink is None else call.sink.numpy())
    for launch in ("preprocess", "attention", "merge", "repair"):
        if stats[launch] is not None:
            annotate_launch(stats[launch], _model)
    _last_stats = stats
    call.finish(problem)
