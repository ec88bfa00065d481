"""What the AscendC kernels of ``ascend_kernels/`` compute, and a problem's tensors in the
form they read them, for the two backends that run those kernels: ``ascendc-emu`` (the CPU
emulation) and ``npu`` (an Ascend NPU through torch_npu).

The kernels implement ``fa-fp32``, ``pasa`` and ``pasa-exact`` for BNSD and BSND (BSH)
tensors, GQA, no mask or the causal band of sparse modes 2/3, ragged lengths, fp16 compute
(bf16 inputs of the PASA allocations are converted by the API layer; the output may be bf16)
and head dims that are multiples of 16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .problem import AttentionProblem

#: the allocations the kernels implement, each with its tiling key (the attention kernel's
#: C++ dispatch)
TILING_KEYS = {"fa-fp32": 0, "pasa": 1, "pasa-exact": 2}
#: memory orders of a (B, N, S, D) view the kernels read and write (PASA_LAYOUT_*)
BNSD, BSND = 0, 1
_INT32 = (-(2 ** 31), 2 ** 31 - 1)


def unsupported_reason(problem: AttentionProblem, backend: str) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they
    lack, in a sentence naming ``backend``."""
    alloc = problem.allocation.name
    if alloc not in TILING_KEYS:
        return (f"the {backend} kernels implement algorithm in {sorted(TILING_KEYS)}, "
                f"not {alloc!r}")
    if problem.packed:
        return f"packed layouts (TND/NTD) are not supported by the {backend} kernels"
    if problem.mask is not None:
        return (f"an explicit atten_mask is not supported by the {backend} kernels (causal "
                f"sparse modes 2/3 are)")
    if problem.band is not None:
        pre, _ = problem.band
        if bool((pre < problem.q_lens).any()):
            return (f"a band with a lower bound (pre_tokens / sparse_mode 4) is not supported by "
                    f"the {backend} kernels; only the causal band of sparse modes 2 and 3")
    if problem.rounding_guard:
        return f"rounding_guard=True is not supported by the {backend} kernels"
    in_dtype, out_dtype = problem.query.dtype, problem.out.dtype
    if in_dtype not in (torch.float16, torch.bfloat16) or out_dtype not in (torch.float16, torch.bfloat16):
        return f"dtypes {in_dtype} -> {out_dtype} are not supported by the {backend} kernels"
    if in_dtype == torch.bfloat16 and (problem.allocation.shifts_keys
                                       or out_dtype != torch.bfloat16):
        return f"bf16 inputs are supported for fa-fp32 only, not for {alloc!r}"
    d, d_v = problem.query.shape[3], problem.value.shape[3]
    if d % 16 or d_v % 16:
        return f"head dims must be multiples of 16 for the cube (got D={d}, Dv={d_v})"
    return None


def layout_of(t: torch.Tensor) -> Optional[int]:
    """BNSD if the (B, N, S, D) view is a contiguous BNSD tensor, BSND if contiguous BSND,
    else None."""
    if t.is_contiguous():
        return BNSD
    if t.permute(0, 2, 1, 3).is_contiguous():
        return BSND
    return None


def in_layout(t: torch.Tensor, layout: int) -> torch.Tensor:
    """The (B, N, S, D) view ``t`` backed by a tensor contiguous in ``layout`` (a copy when
    it is not already)."""
    if layout == BNSD:
        return t.contiguous()
    return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


@dataclass(frozen=True)
class KernelCall:
    """One call of the kernels. Tensors are (B, N, S, D) views, each contiguous in the
    memory order its layout names; key and value share one. ``out`` is the problem's
    output when it already is such a view, else a BNSD temporary that :meth:`finish` copies
    back; ``lse`` likewise (float32, (B, Nq, Sq)), None when the problem wants no LSE."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    out: torch.Tensor
    lse: Optional[torch.Tensor]
    q_layout: int
    kv_layout: int
    out_layout: int
    tiling_key: int
    mask_mode: int
    next_tokens: torch.Tensor  # int64 on CPU, within int32

    def finish(self, problem: AttentionProblem) -> None:
        """Copy the temporaries (if any) into the problem's output views."""
        if self.out is not problem.out:
            problem.out.copy_(self.out)
        if problem.lse is not None and self.lse is not problem.lse:
            problem.lse.copy_(self.lse)


def kernel_call(problem: AttentionProblem) -> KernelCall:
    """``problem`` (which the kernels support) as the kernels read it: inputs copied only
    where their memory order is neither BNSD nor BSND, V copied to K's layout if it differs."""
    q, k, v = problem.query, problem.key, problem.value
    q_layout = layout_of(q)
    if q_layout is None:
        q, q_layout = q.contiguous(), BNSD
    kv_layout = layout_of(k)
    if kv_layout is None:
        k, kv_layout = k.contiguous(), BNSD
    if layout_of(v) != kv_layout:  # the kernel reads K and V in one layout
        v = in_layout(v, kv_layout)
    out, out_layout = problem.out, layout_of(problem.out)
    if out_layout is None:
        out, out_layout = torch.zeros(out.shape, dtype=out.dtype, device=out.device), BNSD
    lse = problem.lse
    if lse is not None and not lse.is_contiguous():
        lse = torch.full(lse.shape, -math.inf, dtype=torch.float32, device=lse.device)
    mask_mode, next_tokens = 0, torch.zeros(problem.batch, dtype=torch.int64)
    if problem.band is not None:
        mask_mode, next_tokens = 1, problem.band[1].clamp(*_INT32)
    return KernelCall(query=q, key=k, value=v, out=out, lse=lse, q_layout=q_layout,
                      kv_layout=kv_layout, out_layout=out_layout,
                      tiling_key=TILING_KEYS[problem.allocation.name],
                      mask_mode=mask_mode, next_tokens=next_tokens)
