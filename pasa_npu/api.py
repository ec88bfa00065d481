"""``fused_attention``: a drop-in for ``torch_npu.npu_fused_infer_attention_score``.

The public functions. The API layer behind them validates and normalises torch_npu's
arguments (:mod:`pasa_npu.arguments`, :mod:`pasa_npu.masks`) into a cached plan
(:mod:`pasa_npu.plans`), dispatches the resulting
:class:`~pasa_npu.problem.AttentionProblem` to a backend and shapes the results as
torch_npu returns them (:mod:`pasa_npu.outputs`); under torch.compile a call is one opaque
operator (:mod:`pasa_npu.compiled`). Only this layer knows about layouts, mask shapes and
sparse modes.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import arguments, compiled, plans
from .masks import check_optimized_mask, compressed_causal_mask

__all__ = ["fused_attention", "fused_attention_v2", "plan", "plan_v2", "reference_attention",
           "reference_attention_v2", "compressed_causal_mask", "AttentionPlan"]


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with torch_npu's interface, computed by PASA or a reference allocation.

    Arguments up to ``value_antiquant_mode`` are torch_npu's, with its names,
    defaults, layouts (BSH, BSND, BNSD, TND and the ``X_Y`` output variants),
    mask conventions (True/1 = masked) and ``sparse_mode`` 0-4 semantics. Returns
    ``(attention_out, softmax_lse)``: the output in the output layout and the
    input dtype; the LSE in float32, (B, N, S1, 1) or (T, N, 1) for packed
    layouts, when ``softmax_lse_flag``, else an empty (0,) float32 tensor.

    Our keywords:

    * ``algorithm``: a precision allocation (docs/design.md, "Precision allocations":
      ``pasa``, ``pasa-mixed``, ``pasa-exact``, ``fa-fp32``, ``fa-fp16s``, ``fa-fp16``).
      None picks by ``inner_precise`` bit 0: ``fa-fp32`` (0, high precision)
      or ``pasa`` (1, high performance); bf16 inputs take bit 0 = 0's (FIA's rule).
      An explicit algorithm takes precedence over bit 0.
    * ``beta``: PASA's shift fraction (``pasa``, ``pasa-mixed``); None solves the
      optimal accuracy condition for the stored shifting matrix (ValueError at a
      ``scale`` where its fp16 entries underflow or overflow).
    * ``backend``: ``auto``, ``torch``; ``triton``, ``ascendc-emu``, ``ascendc-sim``,
      ``npu`` where built.
    * ``rounding_guard``: the dynamic maximum for rows with a repeated maximum
      (docs/design.md, "The rounding guard").
    * ``q_block``, ``kv_block``: the tiling (default 128 x 128, each at most 8192).
    * ``repair_overflow``: True (default): a PASA row whose fp16 scores or statistics
      overflow, or whose shifted scores or recovered block offsets reach fp16's resolution
      limit, is recomputed by ``fa-fp32`` (:func:`pasa_npu.overflow_report` counts them);
      False: no check.

    Rows with nothing to attend (docs/fia-conformance.md): where the band or the
    lengths leave a row empty, or ``inner_precise`` bit 1 is set, the row is invalid:
    0, LSE +inf. A row only the mask's contents empty, without bit 1, returns the
    mean of V over the batch's valid keys, as a kernel with a finite mask fill does,
    LSE float32's lowest. Rows past ``actual_seq_lengths`` are 0 in both outputs;
    decode ignores ``actual_seq_lengths``. A PASA allocation computes bf16 inputs in
    fp16 (the paper's rule), after a range check that raises instead of returning inf.

    Under torch.compile the call is one opaque operator,
    ``torch.ops.pasa_npu.fused_attention``, that runs this eager call: the compiler
    neither traces into the backends nor fuses away the allocation's roundings.
    """
    call = arguments.bind("fused_attention", query, key, value, keywords)
    if torch.compiler.is_compiling():
        return compiled.traced_call(call)
    return plans.attention(call, golden=False)


fused_attention.__signature__ = arguments.SIGNATURE


def plan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         **keywords) -> AttentionPlan:
    """Validate a :func:`fused_attention` call once, for many runs (the plan of a plan/run
    split). Takes :func:`fused_attention`'s arguments; of ``query``, ``key`` and ``value``
    only the shapes, strides, dtypes and devices are read, and lengths given on the host
    are copied. Returns an :class:`~pasa_npu.AttentionPlan` whose ``run(query, key,
    value)`` (or call) returns ``fused_attention(query, key, value, **keywords)`` without
    validating the arguments again: e.g. a plan per decode step, a run per layer. What a
    backend refuses of the problem itself (a tile its kernels lack, say) it refuses at the
    first run, as in :func:`fused_attention`."""
    return AttentionPlan(arguments.bind("plan", query, key, value, keywords))


def plan_v2(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            **keywords) -> AttentionPlan:
    """:func:`plan` for a :func:`fused_attention_v2` call (v2's names and defaults)."""
    call = arguments.bind_v2("plan_v2", query, key, value, keywords)
    try:
        return AttentionPlan(call, v2=True)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise arguments.in_v2_names(exc)


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 golden attention with the same (torch_npu) arguments as :func:`fused_attention`.

    Dense softmax in fp64, no blocking and no low-precision step; outputs are
    float64 in the requested layout (the LSE too, when ``softmax_lse_flag``).
    """
    own = sorted(set(keywords) & set(arguments.OWN_KEYWORDS))
    if own:
        raise TypeError(f"reference_attention takes torch_npu's arguments only; got {own}")
    call = arguments.bind("reference_attention", query, key, value, keywords)
    return plans.attention(call, golden=True)


def fused_attention_v2(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """A drop-in for ``torch_npu.npu_fused_infer_attention_score_v2``: :func:`fused_attention`
    under v2's names and defaults (``num_query_heads``, ``softmax_scale``, ``actual_seq_qlen``
    / ``actual_seq_kvlen``, ``return_softmax_lse``; the same problem, the same results), and
    v2's additions:

    * ``learnable_sink``: (Nq,) float logits, one per query head, each joining the softmax
      denominator of every row of its head as an extra column with a zero value (gpt-oss's
      attention sinks); the LSE includes it. A -inf logit is no sink; a +inf or NaN one
      makes its head's rows NaN, as a softmax over it does. torch_npu takes it with TND and
      NTD_TND only and a value head dim up to 128. Computed by the ``torch`` backend (every allocation),
      the AscendC kernels (``ascendc-emu``, ``ascendc-sim``, ``npu``: their allocations) and
      the golden; a backend without sinks refuses it (NotImplementedError).
    * ``out_dtype``: float16 or bfloat16 outputs from either input dtype (a torch dtype or
      its ScalarType code, 5 or 15); quantised outputs are not implemented. A bfloat16
      input's output beyond float16's range (65504) is ±inf in float16, as a cast gives.

    v2's quantisation keywords, its reserved dtype keywords and sparse_mode 9 (MLA tree
    mask) are accepted at their defaults only (NotImplementedError otherwise), as v1's
    unimplemented keywords are. Our keywords (``algorithm``, ``backend``, ...) as
    :func:`fused_attention`'s.
    """
    call = arguments.bind_v2("fused_attention_v2", query, key, value, keywords)
    try:
        if torch.compiler.is_compiling():
            return compiled.traced_call(call)
        return plans.attention(call, golden=False)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise arguments.in_v2_names(exc)


fused_attention_v2.__signature__ = arguments.V2_SIGNATURE


def reference_attention_v2(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 golden attention with torch_npu's v2 arguments (:func:`fused_attention_v2`),
    learnable sinks included; float64 outputs, as :func:`reference_attention`'s."""
    own = sorted(set(keywords) & set(arguments.OWN_KEYWORDS))
    if own:
        raise TypeError(f"reference_attention_v2 takes torch_npu's arguments only; got {own}")
    call = arguments.bind_v2("reference_attention_v2", query, key, value, keywords)
    try:
        return plans.attention(call, golden=True)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise arguments.in_v2_names(exc)


class AttentionPlan:
    """A validated call of :func:`pasa_npu.fused_attention` without its tensors' data: the
    plan half of a plan/run split (:func:`plan`). :meth:`run` computes the call on new
    query, key and value tensors; each is checked against the planned one by shape, strides,
    dtype and device only. Every other argument is the plan's: the block table, the sinks
    and the mask's contents are read at every run, the lengths as they were planned (plan
    again when they change, e.g. once per decode step), except lengths given as device
    tensors that stay there (``triton``), which every run reads as they are then. A mask of
    sparse mode 0 or 1 that is not bool is converted at every run, as
    :func:`fused_attention` converts it: such runs are validated in full."""

    __slots__ = ("_plan", "_layouts", "_others", "_converts_mask", "_mask_layout", "_v2")

    def __init__(self, call: arguments.Call, v2: bool = False):
        self._plan = plans.plan_for(call, golden=False)
        call = _planned_lengths(call, self._plan)
        self._others = tuple(getattr(call, name) for name in arguments.CALL_FIELDS[3:])
        self._layouts = tuple(_tensor_layout(t) for t in (call.query, call.key, call.value))
        mask = call.atten_mask
        self._converts_mask = (isinstance(mask, torch.Tensor)
                               and not arguments.plan_holds_mask(call, mask))
        self._mask_layout = _mask_layout(mask)
        self._v2 = v2

    def run(self, query: torch.Tensor, key: torch.Tensor,
            value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of the planned call on ``query``, ``key`` and ``value``. Tensors of other
        shapes, strides, dtypes or devices than planned run as a new call with the plan's
        other arguments, validated in full (and planned, cached) again."""
        call = arguments.Call(query, key, value, *self._others)
        try:
            if torch.compiler.is_compiling():
                return compiled.traced_call(call)
            layouts = (_tensor_layout(query), _tensor_layout(key), _tensor_layout(value))
            mask = call.atten_mask
            if (self._converts_mask or layouts != self._layouts
                    or (mask is not None and _mask_layout(mask) != self._mask_layout)):
                # set_(), t_() or resize_() gave the mask other memory or another view
                return plans.attention(call, golden=False)
            if self._plan.checks_mask:
                check_optimized_mask(mask, self._plan.options.sparse_mode)
            return plans.run(self._plan, call)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise arguments.in_v2_names(exc) if self._v2 else exc

    __call__ = run


def _mask_layout(mask) -> Optional[tuple]:
    """Where a mask's elements lie: its storage address and :func:`_tensor_layout`."""
    return (mask.data_ptr(), *_tensor_layout(mask)) if isinstance(mask, torch.Tensor) else None


def _planned_lengths(call: arguments.Call, plan) -> arguments.Call:
    """``call`` with the values of its host lengths as they are now, copied: a run that is
    validated in full again (other strides, a converted mask) takes the planned lengths
    too, whatever the caller writes into its list or tensor later. Lengths that the plan
    leaves on the device stay the caller's tensor, read at every run."""
    planned = {}
    for name in arguments.LENGTH_ARGUMENTS:
        value = getattr(call, name)
        if isinstance(value, torch.Tensor):
            if name not in plan.device_lengths:
                planned[name] = value.clone()
        elif isinstance(value, list):
            planned[name] = list(value)
    return dataclasses.replace(call, **planned) if planned else call


def _tensor_layout(t) -> tuple:
    if not isinstance(t, torch.Tensor):
        return (type(t),)
    return t.shape, t.stride(), t.dtype, t.device
