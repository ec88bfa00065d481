"""The ``npu`` backend: the AscendC kernels of ``ascend_kernels/`` on an Ascend NPU through
torch_npu.

The compute step is ``torch.ops.pasa_npu.npu_attention``, a C++ operator of the extension
``pasa_npu._npu`` whose one kernel, for NPU tensors (PrivateUse1), is registered with
``TORCH_LIBRARY_IMPL`` (``ascend_kernels/binding/pasa_torch_npu.cpp``). It runs the host
launcher the ``ascendc-emu`` backend runs, with ACL instead of the emulation, on
torch_npu's current stream, without synchronising. What the kernels implement is in
:mod:`pasa_npu.kernel_inputs`; the rest raises ``NotImplementedError`` naming the feature.

This path has been compiled against the public torch_npu and AscendC headers but has never
run on an NPU.
"""
from __future__ import annotations

import importlib
import os
from typing import Optional

import torch

from .kernel_inputs import kernel_call
from .kernel_inputs import unsupported_reason as _kernel_unsupported_reason
from .numerics import RESOLUTION_LIMIT
from .problem import AttentionProblem
from .install_record import recorded_status


def load() -> None:
    """Import torch_npu and the binding, which registers ``torch.ops.pasa_npu.npu_attention``.
    ImportError saying why when the NPU part was not built or does not load."""
    try:
        importlib.import_module("torch_npu")
        importlib.import_module("pasa_npu._npu")
    except ImportError as exc:
        status = recorded_status(os.path.dirname(__file__))
        if not status.startswith("built"):
            raise ImportError(f"backend 'npu' is not built ({status}); see docs/npu.md") from exc
        raise ImportError(f"backend 'npu' was built but does not load: {exc}") from exc


load()


def unsupported_reason(problem: AttentionProblem) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they
    lack (the backend registry has already checked that the tensors are on an NPU)."""
    return _kernel_unsupported_reason(problem, "npu")


#: the operator's per-batch int lists, in its order (empty when the call has none: no band
#: gives no next/pre tokens, an unpacked call no starts)
LENGTH_ARGUMENTS = ("q_lens", "kv_lens", "next_tokens", "pre_tokens", "q_starts", "kv_starts")


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the AscendC kernels on the NPU; writes out (and lse) and, when
    the problem is checked, its row flags (the kernels' repair launch recomputes the flagged
    rows by fa-fp32; pasa and pasa-exact also flag the rows whose shifted scores (or pasa's
    block offsets) reach
    :data:`~pasa_npu.numerics.RESOLUTION_LIMIT`). Queued on the current stream; returns
    without waiting for the device."""
    reason = unsupported_reason(problem)
    if reason is not None:
        raise NotImplementedError(reason)
    call = kernel_call(problem)
    lengths = {name: call.lengths[name].tolist() if name in call.lengths else []
               for name in LENGTH_ARGUMENTS}
    flags = problem.overflow.row_flags if problem.overflow is not None else None
    torch.ops.pasa_npu.npu_attention(
        call.query, call.key, call.value, call.out, call.lse, call.mask, call.block_table,
        call.key_slots, call.sink, flags, *lengths.values(),
        call.tiling_key, call.mask_mode, float(problem.scale), float(problem.beta),
        problem.tiling.q_block, problem.tiling.kv_block, RESOLUTION_LIMIT)
    call.finish(problem)
