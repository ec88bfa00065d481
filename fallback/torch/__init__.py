"""The PyTorch backend: blockwise attention on any device, every step of every allocation."""
