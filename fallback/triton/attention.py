"""Triton backend: every precision allocation on CUDA GPUs (and on CPU under TRITON_INTERPRET=1).

:func:`run` is the backend entry (``pasa_npu.backends``), and :func:`repeat` the entry of a
plan's later calls, which repeat the launches its first call recorded. :func:`run` prepares
what every launch shares (:class:`Shared`) and picks the kernels:

* decode (query length 1): :mod:`decode`;
* prefill: on Hopper the warp-specialised Gluon kernel of :mod:`gluon.prefill` where it
  applies, else the Triton kernel of :mod:`prefill`; PASA's keys shifted in a
  separate pass (:mod:`shift`) or inside the prefill kernel; where the call is
  checked for overflow, the repair launch of :mod:`repair` after it.

The choices are :class:`tuning.Tuning`'s, read once per call; the launch heuristics
are :mod:`launch`'s, the per-batch metadata :mod:`metadata`'s. The numerics
are those of :mod:`softmax`, allocation by allocation the CPU backend's.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch

from pasa_npu.beta import ideal_invariance
from pasa_npu.fallback.gluon import prefill as gluon_prefill
from pasa_npu.fallback.triton import decode, prefill, repair
from pasa_npu.fallback.triton.tuning import Tuning, active as active_tuning
from pasa_npu.fallback.kernel_common import (Binding, allocation_flags, interpreting,
                                             mask_argument, placeholder, pow2)
from pasa_npu.fallback.triton.metadata import (apply_row_rules, device_length_rows,
                                               device_metadata, host_ints)
from pasa_npu.fallback.triton.shift import cached_shift_table, prepare_keys
from pasa_npu.problem import AttentionProblem, call_tensors


class Shared(NamedTuple):
    """The arguments the prefill and decode launches of one call share."""

    lengths: tuple           # q_starts, q_lens, kv_starts, kv_lens: int32 on the device
    band_pre: torch.Tensor   # per-batch band limits (q_lens where there is no band)
    band_next: torch.Tensor
    mask: torch.Tensor       # the explicit mask as uint8, or a placeholder
    mask_strides: tuple
    shift: Optional[torch.Tensor]  # the pseudo-average shift's table (shift)
    lse_arg: torch.Tensor    # the LSE view, or a placeholder
    sink: torch.Tensor       # the learnable sinks (Nq,) fp32, or a placeholder
    gamma: float             # PASA's invariance (fp16-rounded with fp16 statistics), or 0
    constexprs: dict         # the allocation's flags, HAS_MASK, GUARD, BLOCK_N, HEAD_DIM(_V)
    interpret: bool
    batch_stride: Callable   # a tensor's batch stride as the kernels take it (0: packed)
    paged: bool              # K and V are caches read through the block table
    refused: Optional[torch.Tensor]  # lengths given on the device: each batch's refusal

    def strides(self, t: torch.Tensor) -> tuple:
        """The four (B, N, S, D) strides of ``t`` as the kernels take them."""
        return (self.batch_stride(t), t.stride(1), t.stride(2), t.stride(3))

    def kv_strides(self, t: torch.Tensor) -> tuple:
        """K's (or V's) four strides: a paged cache's first one steps its blocks."""
        return tuple(t.stride()) if self.paged else self.strides(t)


def run(problem: AttentionProblem) -> None:
    """Compute ``problem`` with the Triton kernels, writing its output and LSE views. The
    first call of a plan records its launches and workspaces (:class:`Binding`) in the
    plan's state (``problem.plan_state``); a later call of the plan repeats them on its
    own tensors (:func:`_run_prepared`)."""
    tuning = active_tuning()
    if _run_prepared(problem, tuning):
        return
    roles = _roles(problem)
    record = (problem.plan_state is not None and problem.query.is_cuda
              and not torch.cuda.is_current_stream_capturing())
    binding = Binding(roles if record else None)
    shared = _shared(problem, roles.get("sink"), binding)
    if (problem.max_q_len == 1 and problem.band is None
            and (problem.mask is None or problem.mask.shape[1] == 1)):
        decode.run(problem, tuning, shared, binding)
    elif _gluon_prefill(problem, tuning):
        k_used, means, k_pages = problem.key, None, problem.block_table
        in_launch = gluon_prefill.shifts_in_launch(problem, tuning)
        if problem.allocation.shifts_keys:
            k_used, means, shifted_pages = prepare_keys(
                problem, problem.key, shared.lengths[2], shared.lengths[3],
                shared.constexprs["BLOCK_N"], shared.constexprs["HEAD_DIM"], binding,
                launch=not in_launch)
            k_pages = shifted_pages if problem.paged else None
        overflow_word = gluon_prefill.run(problem, shared.gamma, k_used,
                                          means if problem.allocation.exact_shift else None,
                                          shared.band_pre, shared.band_next, shared.lse_arg,
                                          shared.shift, k_pages, binding, in_launch)
        if overflow_word is not None:
            repair.run(problem, shared, overflow_word, binding)
    else:
        if problem.paged and problem.block_size % shared.constexprs["BLOCK_N"]:
            raise NotImplementedError(
                f"the Triton backend's paged prefill needs kv_block to divide block_size "
                f"(a kv block inside one cache block); got kv_block "
                f"{shared.constexprs['BLOCK_N']} and block_size {problem.block_size}")
        prefill.run(problem, tuning, shared, binding)
    if shared.refused is not None:
        apply_row_rules(problem, (*shared.lengths, shared.band_pre, shared.band_next,
                                  shared.refused), binding)
    prepared = binding.prepared()
    if prepared is not None:
        problem.plan_state[_PREPARED] = (_prepared_key(problem, tuning), prepared)


_PREPARED = "triton"  # the plan state's entry: (its key, the recorded call)


def _roles(problem: AttentionProblem) -> dict:
    """The tensors of one call that the launches take, by role, as the kernels take them
    (everything else they take is the plan's, or a workspace the call makes)."""
    roles = call_tensors(
        problem.query, problem.key, problem.value, problem.out, problem.lse,
        None if problem.overflow is None else problem.overflow.row_flags,
        None if problem.sink is None else problem.sink.to(problem.query.device, torch.float32),
        problem.block_table)
    if problem.device_lengths is not None:  # the call's own, read by the lengths kernel
        for role, given in zip(("q_lens_given", "kv_lens_given"), problem.device_lengths[:2]):
            if given is not None:
                roles[role] = given
    return roles


def _run_prepared(problem: AttentionProblem, tuning: Tuning) -> bool:
    """Repeat the launches a previous call of ``problem``'s plan recorded, if any, on this
    call's tensors; False where there are none, or where this call differs from that
    one in what they fixed (the tuning, the kinds of tensors present, the stream, the
    tensors' strides or alignment) or a CUDA graph is being captured."""
    entry = problem.plan_state.get(_PREPARED) if problem.plan_state else None
    if (entry is None or entry[0] != _prepared_key(problem, tuning)
            or torch.cuda.is_current_stream_capturing()):
        return False
    return entry[1](_roles(problem))


def repeat(plan_state: dict, tensors: dict) -> bool:
    """Repeat the launches the plan's first call recorded on another call's own tensors
    (:func:`~pasa_npu.problem.call_tensors`), for the API layer's calls that match the
    record in all :func:`_prepared_key` holds but the tuning and the stream, which are
    checked here (a call of the plan without device lengths, in the record's form); False,
    launching nothing, where there is no record, they differ, a CUDA graph is being
    captured or a tensor's strides or alignment differ from the record's."""
    entry = plan_state.get(_PREPARED)
    if entry is None:
        return False
    key, tuning = entry[0], active_tuning()
    if ((key[0] is not tuning and key[0] != tuning)
            or key[-1] != torch._C._cuda_getCurrentRawStream(tensors["query"].get_device())
            or torch._C._cuda_isCurrentStreamCapturing()):
        return False
    return entry[1](tensors)


def _prepared_key(problem: AttentionProblem, tuning: Tuning) -> tuple:
    """What a call of one plan may differ in that recorded launches depend on: the tuning,
    which optional tensors it has, their shapes, the dtype and form of lengths given on the
    device, and the stream (the lengths' copy was queued on the first call's stream, which
    this one then follows)."""
    dev = problem.query.device
    given = (() if problem.device_lengths is None else
             tuple(None if t is None else (t.dtype, t.numel() == 1)
                   for t in problem.device_lengths[:2]))
    # the tuning first and the stream last: repeat() reads them there
    return (tuning, problem.lse is None, problem.overflow is None, problem.sink is None,
            problem.paged, problem.query.shape, problem.key.shape, problem.value.shape,
            problem.out.shape, given, torch._C._cuda_getCurrentRawStream(dev.index))


def _shared(problem: AttentionProblem, sink: Optional[torch.Tensor], binding: Binding) -> Shared:
    """Check that the kernels cover ``problem``'s tiling and head dims, and prepare what
    every launch takes (``sink``: the sinks as the kernels take them, or None; lengths
    given on the device made there through ``binding``)."""
    q, v = problem.query, problem.value
    block_n = problem.tiling.kv_block
    if block_n < 16 or block_n & (block_n - 1):
        raise NotImplementedError(f"the Triton backend needs kv_block a power of two >= 16, got "
                                  f"{block_n}")
    head_dim, head_dim_v = q.shape[3], v.shape[3]
    head_dim_p, head_dim_vp = pow2(head_dim), pow2(head_dim_v)
    if head_dim_p > 256 or head_dim_vp > 256:
        raise NotImplementedError(f"the Triton backend supports head dims up to 256, got "
                                  f"{head_dim}/{head_dim_v}")
    dev = q.device
    refused = None
    if problem.device_lengths is not None:
        *lengths, band_pre, band_next, refused = device_length_rows(problem, dev, binding)
    else:
        *lengths, band_pre, band_next = device_metadata(problem, dev)
    alloc = problem.allocation
    gamma = ideal_invariance(problem.beta) if alloc.pseudo_average_shift else 0.0
    if alloc.low_statistics:
        gamma = torch.tensor(gamma).half().item()  # the kernel's fp16 scalar
    mask, mask_strides = mask_argument(problem.mask, dev)
    lse_arg = problem.lse if problem.lse is not None else placeholder(dev, torch.float32)
    if sink is None:
        sink = placeholder(dev, torch.float32)
    shift = (cached_shift_table(problem.beta, block_n, problem.scale, dev)
             if alloc.pseudo_average_shift else None)
    constexprs = dict(**allocation_flags(alloc), HAS_MASK=problem.mask is not None,
                      GUARD=problem.rounding_guard,
                      BLOCK_N=block_n, HEAD_DIM=head_dim_p, HEAD_DIM_V=head_dim_vp)
    batch_stride = _no_stride if problem.packed else _batch_stride
    return Shared(tuple(lengths), band_pre, band_next, mask, mask_strides, shift, lse_arg, sink,
                  gamma,
                  constexprs, interpreting(), batch_stride, problem.paged, refused)


def _batch_stride(t: torch.Tensor) -> int:
    return t.stride(0)


def _no_stride(t: torch.Tensor) -> int:
    return 0  # packed layouts: one batch entry, never stepped


def _gluon_prefill(problem: AttentionProblem, tuning: Tuning) -> bool:
    """Whether prefill runs on the warp-specialised Gluon kernel (``tuning.prefill``)."""
    if tuning.prefill == "triton" or (tuning.prefill == "auto" and tuning.triton_kernel_only()):
        return False  # a Triton-kernel switch was asked for: measure that kernel
    if problem.device_lengths is not None:
        return False  # it takes whole lengths the host knows
    return gluon_prefill.supported(
        problem, [host_ints(t) for t in (problem.q_starts, problem.q_lens, problem.kv_starts,
                                         problem.kv_lens)])
