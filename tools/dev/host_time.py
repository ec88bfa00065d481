"""``python -m pasa_npu.tools.dev.ablate --host-time``: host time per call, any machine.

The API layer's host time per ``fused_attention`` call, with the argument plan cached (as
every repeated call is), rebuilt on every call, and with kv lengths that grow by one token
per call (a decode loop), on a decode-shaped CPU call whose backend computes nothing; on a
CUDA GPU also an eager Triton decode step with fixed and with growing kv lengths and an
eager prefill call, each with the kernels launched directly and through Triton's
``kernel[grid]``, and the decode step with the overflow check off.
"""
from __future__ import annotations

import time

import torch

import pasa_npu
from pasa_npu import plans


#: how ``host_time_us`` calls: the same arguments every call (a repeated call finds its
#: cached plan), the plan rebuilt on every call, or actual_seq_lengths_kv one token longer
#: on every call, as a decode loop over a preallocated KV cache passes it
HOST_TIME_MODES = ("cached", "rebuilt", "growing")


def host_time_us(mode: str, calls: int = 2000) -> float:
    """Microseconds per ``fused_attention`` call spent outside the backend's computation,
    on a decode-shaped CPU call whose backend computes nothing (``HOST_TIME_MODES``)."""
    from pasa_npu.tools.bench_host import no_op_kernel

    b, h, h_kv, s2, d = 8, 32, 4, 8192, 128
    q = torch.zeros(b, h, 1, d, dtype=torch.float16)
    k = v = torch.zeros(b, h_kv, s2, d, dtype=torch.float16)
    kw = dict(num_heads=h, num_key_value_heads=h_kv, input_layout="BNSD", scale=d ** -0.5,
              algorithm="pasa-exact", backend="torch")
    lengths = (lambda i: [1000 + i] * b) if mode == "growing" else (lambda i: None)  # noqa: E731
    plans.clear()
    try:
        with no_op_kernel():
            for i in range(50):
                pasa_npu.fused_attention(q, k, v, actual_seq_lengths_kv=lengths(calls + i), **kw)
            start = time.perf_counter()
            for i in range(calls):
                if mode == "rebuilt":
                    plans.clear()
                pasa_npu.fused_attention(q, k, v, actual_seq_lengths_kv=lengths(i), **kw)
            return (time.perf_counter() - start) / calls * 1e6
    finally:
        plans.clear()


def decode_step_us(growing: bool, steps: int = 300, check: bool = True) -> tuple[float, float]:
    """(host, wall) microseconds per eager decode step of the Triton backend on the GPU
    (pasa-exact, batch 8, 32 query heads, GQA 4:1, d=128, an 8k cache holding 7k-7.6k
    tokens), the kv lengths fixed or one token longer on every step, the overflow check on
    (``repair_overflow``) or off. Host: until the call returns; wall: until the GPU is
    done. Warmed up on the even lengths of the range and timed on the odd ones, so that a
    growing step meets new lengths but no kernel compiles."""
    b, h, h_kv, cap, d = 8, 32, 8, 8192, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16, generator=gen)
    k, v = (torch.randn(b, h_kv, cap, d, device="cuda", dtype=torch.float16, generator=gen)
            for _ in range(2))

    def step(i):
        pasa_npu.fused_attention(
            q, k, v, num_heads=h, num_key_value_heads=h_kv, input_layout="BNSD",
            scale=d ** -0.5, algorithm="pasa-exact", backend="triton", repair_overflow=check,
            actual_seq_lengths_kv=[7000 + (i if growing else 0)] * b)

    try:
        for i in range(steps):
            step(2 * i)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            step(2 * i + 1)
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        return host / steps * 1e6, (time.perf_counter() - start) / steps * 1e6
    finally:
        plans.clear()


def prefill_call_us(calls: int = 300) -> float:
    """Host microseconds per eager pasa-exact prefill call of the Triton backend on the GPU
    at a shape whose kernels take less GPU time than the call takes host time (batch 1,
    32 heads, S = 256, d = 64, causal), so that the loop measures the host alone."""
    h, s, d = 32, 256, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, h, s, d, device="cuda", dtype=torch.float16, generator=gen)
               for _ in range(3))
    mask = pasa_npu.compressed_causal_mask("cuda")

    def call():
        pasa_npu.fused_attention(q, k, v, num_heads=h, num_key_value_heads=h,
                                 input_layout="BNSD", scale=d ** -0.5, algorithm="pasa-exact",
                                 backend="triton", sparse_mode=3, atten_mask=mask)

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def gpu_host_times() -> None:
    """Eager decode steps and prefill calls on the GPU, host time, with the kernels launched
    directly (``kernel_common.launch``) and through Triton's ``kernel[grid]``, and decode
    steps launched directly with the overflow check off, three rounds interleaved (medians:
    that host is noisy)."""
    from pasa_npu.fallback import kernel_common

    runs: dict = {}
    try:
        for _ in range(3):
            for direct in (False, True):
                kernel_common.DIRECT_LAUNCH = direct
                for growing in (False, True):
                    runs.setdefault(("decode", growing, direct), []).append(
                        decode_step_us(growing))
                runs.setdefault(("prefill", None, direct), []).append(prefill_call_us())
            runs.setdefault(("unchecked", False, True), []).append(
                decode_step_us(False, check=False))
    finally:
        kernel_common.DIRECT_LAUNCH = True

    def median(key, part=0):
        values = sorted(r[part] if isinstance(r, tuple) else r for r in runs[key])
        return values[len(values) // 2]
    for direct in (True, False):
        how = "launched directly" if direct else "launched through kernel[grid]"
        for growing in (False, True):
            key = ("decode", growing, direct)
            print(f"Eager Triton decode step on the GPU, kv lengths "
                  f"{'growing by one token per step' if growing else 'fixed'}, {how}: "
                  f"{median(key):.0f} us host, {median(key, 1):.0f} us until the GPU is done")
        print(f"Eager Triton prefill call on the GPU (pasa-exact, S = 256, causal), {how}: "
              f"{median(('prefill', None, direct)):.0f} us host")
    print(f"Eager Triton decode step on the GPU, kv lengths fixed, launched directly, "
          f"overflow check off: {median(('unchecked', False, True)):.0f} us host, "
          f"{median(('unchecked', False, True), 1):.0f} us until the GPU is done")


def print_host_times() -> None:
    """What ``--host-time`` prints: the API layer's host time per call in each of
    :data:`HOST_TIME_MODES`, then, on a CUDA GPU, :func:`gpu_host_times`."""
    us = {mode: host_time_us(mode) for mode in HOST_TIME_MODES}
    print(f"API host time per call: {us['cached']:.0f} us with the argument plan cached, "
          f"{us['rebuilt']:.0f} us rebuilding it on every call, {us['growing']:.0f} us "
          f"with actual_seq_lengths_kv one token longer on every call")
    if torch.cuda.is_available():
        gpu_host_times()
