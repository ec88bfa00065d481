"""pasa_npu: PASA (online pseudo-average shifting attention) for Ascend NPUs, with
Triton GPU and PyTorch CPU fallbacks.

``fused_attention`` is a drop-in for ``torch_npu.npu_fused_infer_attention_score``;
``reference_attention`` is its fp64 golden; ``optimal_beta`` solves the paper's
optimal accuracy condition for the stored shifting matrix.
"""
from .api import compressed_causal_mask, fused_attention, reference_attention
from .beta import optimal_beta, shift_matrix
from .numerics import ALGORITHM_NAMES, ALLOCATIONS, DEFAULT_TILING, Allocation, Tiling

__all__ = [
    "fused_attention", "reference_attention", "compressed_causal_mask", "optimal_beta",
    "shift_matrix", "ALGORITHM_NAMES", "ALLOCATIONS", "DEFAULT_TILING", "Allocation", "Tiling",
]
__version__ = "0.1.0"
