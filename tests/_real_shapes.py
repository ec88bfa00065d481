"""Prefill shapes people run, shared by the real-shape tests of every backend
(test_ascendc_emu_shapes on the emulated NPU, test_gpu_real_shapes on a CUDA GPU), as
test_golden.make_case takes them."""
from __future__ import annotations

PREFILL_SHAPES = {
    # the paper's shape: 16 heads x 10 query tiles of 128 rows, 10 kv blocks each
    "paper-1x16x1280x128": dict(layout="BNSD", B=1, Nq=16, Nkv=16, S1=1280, S2=1280, D=128),
    # a Qwen2-7B-like layer: GQA 28:4, causal prefill of 1024 tokens
    "qwen2-gqa28:4-causal": dict(layout="BSH", B=1, Nq=28, Nkv=4, S1=1024, S2=1024, D=128,
                                 sparse_mode=3, mask="optimized"),
    # a ragged packed batch: four requests of different lengths, causal per request
    "tnd-ragged-causal": dict(layout="TND", Nq=16, Nkv=4, D=128, q_cum=[700, 717, 1317, 1650],
                              kv_cum=[700, 717, 1317, 1650], sparse_mode=3, mask="optimized"),
}
