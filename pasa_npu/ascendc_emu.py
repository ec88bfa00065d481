"""The ``ascendc-emu`` backend: the AscendC kernel sources of ``ascend_kernels/`` run on CPU.

The extension ``pasa_npu._ascendc_emu`` compiles the kernel files unchanged against the
project's emulation of the AscendC API (``ascend_kernels/emu/kernel_operator.h``): one cube
thread and two vector threads per AI Core, the real buffer budgets, alignment rules, queue
discipline, pipe and cross-core synchronisation checked. Nothing here has run on an NPU.

The kernels implement ``fa-fp32``, ``pasa`` and ``pasa-exact`` for BNSD/BSND(BSH) tensors,
GQA, no mask or the causal band of sparse modes 2/3, ragged lengths, fp16 compute (bf16
inputs of the PASA allocations are converted by the API layer; the output may be bf16).
Everything else raises ``NotImplementedError`` naming the feature.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from pasa_npu import _ascendc_emu  # ImportError when the extension was not built
from pasa_npu.problem import AttentionProblem

#: the allocations the kernels implement, each with its tiling key (the attention kernel's
#: C++ dispatch)
TILING_KEYS = {"fa-fp32": 0, "pasa": 1, "pasa-exact": 2}
#: AI Cores the tiling splits the work over (Atlas A2: 24 AI Cores of 1 AIC + 2 AIV)
CORE_NUM = 24
#: seconds a cross-core wait may block before the emulation reports a hang
WAIT_TIMEOUT_S = 60.0

_BNSD, _BSND = 0, 1
_last_stats: Optional[dict] = None


def last_run_stats() -> Optional[dict]:
    """Bytes moved per path and cube/vector work of the last call (for the NPU cost model):
    ``{"preprocess": {...} or None, "attention": {...}, "tiling": {...}}``."""
    return _last_stats


def unsupported_reason(problem: AttentionProblem) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they lack."""
    alloc = problem.allocation.name
    if alloc not in TILING_KEYS:
        return (f"the ascendc-emu kernels implement algorithm in {sorted(TILING_KEYS)}, "
                f"not {alloc!r}")
    if problem.packed:
        return "packed layouts (TND/NTD) are not supported by the ascendc-emu kernels"
    if problem.mask is not None:
        return "an explicit atten_mask is not supported by the ascendc-emu kernels (causal sparse modes 2/3 are)"
    if problem.band is not None:
        pre, _ = problem.band
        if bool((pre < problem.q_lens).any()):
            return ("a band with a lower bound (pre_tokens / sparse_mode 4) is not supported by the "
                    "ascendc-emu kernels; only the causal band of sparse modes 2 and 3")
    if problem.rounding_guard:
        return "rounding_guard=True is not supported by the ascendc-emu kernels"
    in_dtype, out_dtype = problem.query.dtype, problem.out.dtype
    if in_dtype not in (torch.float16, torch.bfloat16) or out_dtype not in (torch.float16, torch.bfloat16):
        return f"dtypes {in_dtype} -> {out_dtype} are not supported by the ascendc-emu kernels"
    if in_dtype == torch.bfloat16 and (problem.allocation.shifts_keys
                                       or out_dtype != torch.bfloat16):
        return f"bf16 inputs are supported for fa-fp32 only, not for {alloc!r}"

    d, d_v = problem.query.shape[3], problem.value.shape[3]
    if d % 16 or d_v % 16:
        return f"head dims must be multiples of 16 for the cube (got D={d}, Dv={d_v})"
    if problem.query.device.type != "cpu":
        return "the ascendc-emu backend runs on CPU tensors"
    return None


def _layout_of(t: torch.Tensor) -> Optional[int]:
    """0 if the (B, N, S, D) view is a contiguous BNSD tensor, 1 if contiguous BSND, else None."""
    if t.is_contiguous():
        return _BNSD
    if t.permute(0, 2, 1, 3).is_contiguous():
        return _BSND
    return None


def _as_kernel_input(t: torch.Tensor):
    """(numpy array in the kernel's memory order, layout) without copying when possible."""
    layout = _layout_of(t)
    if layout is None:
        t, layout = t.contiguous(), _BNSD
    mem = t if layout == _BNSD else t.permute(0, 2, 1, 3)
    return mem.detach().contiguous().view(torch.int16).numpy(), layout


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the AscendC kernels under emulation; writes out (and lse)."""
    global _last_stats
    reason = unsupported_reason(problem)
    if reason is not None:
        raise NotImplementedError(reason)
    q, k, v = problem.query, problem.key, problem.value
    batch, n_q, s_q, d = q.shape
    n_kv, s_kv, d_v = k.shape[1], k.shape[2], v.shape[3]

    q_np, q_layout = _as_kernel_input(q)
    k_np, kv_layout = _as_kernel_input(k)
    v_np, v_layout = _as_kernel_input(v)
    if v_layout != kv_layout:  # the kernel reads K and V in one layout
        v_np = (v.contiguous() if kv_layout == _BNSD else v.permute(0, 2, 1, 3).contiguous()).view(torch.int16).numpy()

    out_layout = _layout_of(problem.out)
    direct = out_layout is not None  # write straight into the caller's output
    if direct:
        out_mem = problem.out if out_layout == _BNSD else problem.out.permute(0, 2, 1, 3)
    else:
        out_layout = _BNSD
        out_mem = torch.zeros(problem.out.shape, dtype=problem.out.dtype)
    out_np = out_mem.view(torch.int16).numpy()
    lse = problem.lse if problem.lse is not None and problem.lse.is_contiguous() else None
    lse_mem = lse if lse is not None else torch.full((batch, n_q, s_q), -math.inf, dtype=torch.float32)

    next_tokens = torch.zeros(batch, dtype=torch.int64)
    mask_mode = 0
    if problem.band is not None:
        mask_mode = 1
        next_tokens = problem.band[1].clamp(-(2 ** 31), 2 ** 31 - 1)
    params = dict(
        tiling_key=TILING_KEYS[problem.allocation.name], batch=batch, num_heads=n_q,
        num_kv_heads=n_kv, seq_q=s_q, seq_kv=s_kv, head_dim=d, head_dim_v=d_v, q_layout=q_layout,
        kv_layout=kv_layout, out_layout=out_layout,
        out_dtype=0 if problem.out.dtype == torch.float16 else 1,
        in_dtype=0 if q.dtype == torch.float16 else 1, mask_mode=mask_mode,
        scale=float(problem.scale), beta=float(problem.beta), q_tile=problem.tiling.q_block,
        kv_block=problem.tiling.kv_block, core_num=CORE_NUM, timeout_s=WAIT_TIMEOUT_S)
    try:
        _ascendc_emu.tiling(params)
    except ValueError as exc:  # a configuration the kernels cannot tile
        raise NotImplementedError(f"ascendc-emu: {exc}") from None
    to_i32 = lambda t: t.to(torch.int32).contiguous().numpy()  # noqa: E731
    _last_stats = _ascendc_emu.run_attention(
        q_np, k_np, v_np, to_i32(problem.q_lens), to_i32(problem.kv_lens), to_i32(next_tokens),
        out_np, lse_mem.numpy(), params)
    if not direct:
        problem.out.copy_(out_mem)
    if problem.lse is not None and lse is None:
        problem.lse.copy_(lse_mem)
