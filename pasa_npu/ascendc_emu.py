"""The ``ascendc-emu`` backend: the AscendC kernel sources of ``ascend_kernels/`` run on CPU.

The extension ``pasa_npu._ascendc_emu`` compiles the kernel files unchanged against the
project's emulation of the AscendC API (``ascend_kernels/emu/kernel_operator.h``): one cube
thread and two vector threads per AI Core, the real buffer budgets, alignment rules, queue
discipline, pipe and cross-core synchronisation checked. A call goes through the same host
launcher as the NPU build (``ascend_kernels/host/pasa_launcher.h``), with an emulated
runtime in place of ACL. Nothing here has run on an NPU.

What the kernels implement is in :mod:`pasa_npu.kernel_inputs`; everything else raises
``NotImplementedError`` naming the feature.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from pasa_npu import _ascendc_emu  # ImportError when the extension was not built
from pasa_npu.kernel_inputs import SUPPORTED_ALGORITHMS, BNSD, kernel_call
from pasa_npu.kernel_inputs import unsupported_reason as _kernel_unsupported_reason
from pasa_npu.problem import AttentionProblem

__all__ = ["SUPPORTED_ALGORITHMS", "CORE_NUM", "last_run_stats", "unsupported_reason", "run"]

#: AI Cores the tiling splits the work over (Atlas A2: 24 AI Cores of 1 AIC + 2 AIV)
CORE_NUM = 24
#: seconds a cross-core wait may block before the emulation reports a hang
WAIT_TIMEOUT_S = 60.0

_last_stats: Optional[dict] = None


def last_run_stats() -> Optional[dict]:
    """Bytes moved per path and cube/vector work of the last call (for the NPU cost model):
    ``{"preprocess": {...} or None, "attention": {...}, "tiling": {...}, "runtime_calls":
    [...]}``; ``runtime_calls`` lists the shared launcher's calls of the emulated runtime."""
    return _last_stats


def unsupported_reason(problem: AttentionProblem) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they lack."""
    reason = _kernel_unsupported_reason(problem, "ascendc-emu")
    if reason is None and problem.query.device.type != "cpu":
        return "the ascendc-emu backend runs on CPU tensors"
    return reason


def _memory(t: torch.Tensor, layout: int):
    """The int16 numpy array of a (B, N, S, D) view in its memory order (no copy)."""
    return (t if layout == BNSD else t.permute(0, 2, 1, 3)).view(torch.int16).numpy()


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
    params = dict(
        tiling_key=call.tiling_key, batch=batch, num_heads=n_q, num_kv_heads=n_kv, seq_q=s_q,
        seq_kv=s_kv, head_dim=d, head_dim_v=d_v, q_layout=call.q_layout,
        kv_layout=call.kv_layout, out_layout=call.out_layout,
        out_dtype=0 if call.out.dtype == torch.float16 else 1,
        in_dtype=0 if call.query.dtype == torch.float16 else 1, mask_mode=call.mask_mode,
        scale=float(problem.scale), beta=float(problem.beta), q_tile=problem.tiling.q_block,
        kv_block=problem.tiling.kv_block, core_num=CORE_NUM, timeout_s=WAIT_TIMEOUT_S)
    try:
        _ascendc_emu.tiling(params)
    except ValueError as exc:  # a configuration the kernels cannot tile
        raise NotImplementedError(f"ascendc-emu: {exc}") from None
    to_i32 = lambda t: t.to(torch.int32).contiguous().numpy()  # noqa: E731
    _last_stats = _ascendc_emu.run_attention(
        _memory(call.query, call.q_layout), _memory(call.key, call.kv_layout),
        _memory(call.value, call.kv_layout), to_i32(problem.q_lens), to_i32(problem.kv_lens),
        to_i32(call.next_tokens), _memory(call.out, call.out_layout), lse.numpy(), params)
    call.finish(problem)
