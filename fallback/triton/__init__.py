"""The Triton backend (CUDA GPUs, or the CPU under TRITON_INTERPRET=1)."""
