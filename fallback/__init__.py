"""Fallback backends: blockwise PyTorch (CPU), the fp64 golden, and Triton (GPU)."""
