"""Fallback backends, one subpackage per family: ``torch`` (blockwise PyTorch, any device),
``triton`` (Triton, CUDA GPUs) and ``gluon`` (its warp-specialised Gluon prefill);
``kernel_common`` holds what the Triton and Gluon launches share."""
