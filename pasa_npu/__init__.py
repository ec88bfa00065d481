"""pasa_npu: PASA (online pseudo-average shifting attention) for Ascend NPUs, with
Triton GPU and PyTorch CPU fallbacks.

``fused_attention`` is a drop-in for ``torch_npu.npu_fused_infer_attention_score`` and
``fused_attention_v2`` for its ``_v2``; ``plan`` validates such a call once for many runs;
``patch_torch_npu`` routes code that calls torch_npu's operator to it;
``reference_attention`` is its fp64 golden; ``optimal_beta`` solves the paper's
optimal accuracy condition for the stored shifting matrix; ``overflow_report`` says which
query rows of the last call were recomputed in fp32 because PASA's fp16 overflowed.
"""
from .api import (compressed_causal_mask, fused_attention, fused_attention_v2, plan, plan_v2,
                  reference_attention, reference_attention_v2)
from .beta import optimal_beta, shift_matrix
from .numerics import ALGORITHM_NAMES, ALLOCATIONS, DEFAULT_TILING, Allocation, Tiling
from .overflow import OverflowReport, OverflowRepairWarning, overflow_report
from .torch_npu_patch import patch_torch_npu, unpatch_torch_npu

__all__ = [
    "fused_attention", "fused_attention_v2", "plan", "plan_v2", "reference_attention",
    "reference_attention_v2",
    "compressed_causal_mask", "optimal_beta",
    "shift_matrix", "patch_torch_npu", "unpatch_torch_npu", "ALGORITHM_NAMES", "ALLOCATIONS",
    "DEFAULT_TILING", "Allocation", "Tiling", "overflow_report", "OverflowReport",
    "OverflowRepairWarning",
]
__version__ = "0.1.0"


def _load_npu() -> None:
    """Where the install built the NPU part: load torch_npu and the binding now, so that
    ``torch.ops.pasa_npu.npu_attention`` exists. Elsewhere (or if it does not load) the
    ``npu`` backend reports why when asked for."""
    import os

    from .install_record import recorded_status
    if recorded_status(os.path.dirname(__file__)).startswith("built"):
        try:
            from . import npu  # noqa: F401
        except ImportError:
            pass


_load_npu()
