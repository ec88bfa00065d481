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

import torch

from . import arguments, compiled, plans
from .masks import compressed_causal_mask

__all__ = ["fused_attention", "reference_attention", "compressed_causal_mask"]


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with torch_npu's interface, computed by PASA or a reference allocation.

    Arguments up to ``value_antiquant_mode`` are torch_npu's, with its names,
    defaults, layouts (BSH, BSND, BNSD, TND and the ``X_Y`` output variants),
    mask conventions (True/1 = masked) and ``sparse_mode`` 0-4 semantics. Returns
    ``(attention_out, softmax_lse)``: the output in the output layout and the
    input dtype; the LSE in float32, (B, N, S1, 1) or (T, N, 1) for packed
    layouts, when ``softmax_lse_flag``, else a one-element zero tensor.

    Our keywords:

    * ``algorithm``: a precision allocation (docs/design.md, "Precision allocations":
      ``pasa``, ``pasa-mixed``, ``pasa-exact``, ``fa-fp32``, ``fa-fp16s``, ``fa-fp16``).
      None picks by ``inner_precise`` bit 0: ``pasa-exact`` (0, high precision)
      or ``pasa`` (1, high performance); an explicit algorithm takes precedence
      over bit 0.
    * ``beta``: PASA's shift fraction (``pasa``, ``pasa-mixed``); None solves the
      optimal accuracy condition for the stored shifting matrix.
    * ``backend``: ``auto``, ``torch``; ``triton``, ``ascendc-emu``, ``npu``
      where built.
    * ``rounding_guard``: the dynamic maximum for rows with a repeated maximum
      (docs/design.md, "The rounding guard").
    * ``q_block``, ``kv_block``: the tiling (default 128 x 128).

    ``inner_precise`` bit 1 set: a row with nothing to attend returns 0. Clear:
    it returns the mean of V over the batch's valid keys, as a kernel with a
    finite mask fill does. Its LSE is -inf either way; rows past
    ``actual_seq_lengths`` are 0 in both outputs. bf16 inputs run PASA in fp16
    (the paper's rule) after a range check.

    Under torch.compile the call is one opaque operator,
    ``torch.ops.pasa_npu.fused_attention``, that runs this eager call: the compiler
    neither traces into the backends nor fuses away the allocation's roundings.
    """
    args = arguments.bind("fused_attention", query, key, value, keywords)
    if torch.compiler.is_compiling():
        return compiled.traced_call(args)
    return plans.attention(args, golden=False)


fused_attention.__signature__ = arguments.SIGNATURE


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        **keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 golden attention with the same (torch_npu) arguments as :func:`fused_attention`.

    Dense softmax in fp64, no blocking and no low-precision step; outputs are
    float64 in the requested layout (the LSE too, when ``softmax_lse_flag``).
    """
    own = sorted(set(keywords) & set(arguments.OWN_KEYWORDS))
    if own:
        raise TypeError(f"reference_attention takes torch_npu's arguments only; got {own}")
    args = arguments.bind("reference_attention", query, key, value, keywords)
    return plans.attention(args, golden=True)
