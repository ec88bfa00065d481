"""The warp-specialised Gluon prefill of the Triton backend (Hopper)."""
