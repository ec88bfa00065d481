"""Test support: an independent dense attention and torch_npu's mask rules written
out by hand, so that the package's own visibility logic is checked, not reused."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

import pasa_npu
from pasa_npu.backends import available_backends

INT_MAX = 2147483647


def npu_absent_reason() -> str | None:
    """None when an NPU and the ``npu`` backend are here, else why not."""
    try:
        import torch_npu  # noqa: F401
    except ImportError as exc:
        return f"torch_npu does not import ({exc})"
    if not torch.npu.is_available():
        return "torch_npu sees no NPU"
    return None if "npu" in available_backends("npu") else "the npu backend is not built"


def _backend_devices() -> list[tuple[str, str]]:
    """(backend, device) pairs to test here: CPU backends on CPU; Triton on the GPU when
    there is one, else through the interpreter on CPU; the npu backend on an NPU."""
    pairs = [(name, "cpu") for name in available_backends("cpu", emulated=True)]
    if torch.cuda.is_available():
        pairs = [(n, d) for n, d in pairs if n != "triton"]
        pairs += [(name, "cuda") for name in available_backends("cuda") if name != "torch"]
    if npu_absent_reason() is None:
        pairs.append(("npu", "npu"))
    return pairs


BACKEND_DEVICES = _backend_devices()
BACKENDS = [name for name, _ in BACKEND_DEVICES]
DEVICE_OF = dict(BACKEND_DEVICES)


def interpreted(backend: str) -> bool:
    """True when ``backend`` runs through an emulator on CPU (slow: test small shapes)."""
    return backend == "triton" and DEVICE_OF.get(backend) == "cpu"


def interpreter_skip(backend: str, algorithm: str, dtype) -> str | None:
    """Why a combination cannot run under Triton's interpreter, or None."""
    computes_bf16 = not pasa_npu.ALLOCATIONS[algorithm].shifts_keys  # PASA computes in fp16
    if interpreted(backend) and dtype == torch.bfloat16 and computes_bf16:
        return ("Triton's CPU interpreter computes bf16 tl.dot wrongly (numpy has no bf16); "
                "bf16 fa-* runs on the GPU only")
    return None


def on_device(backend: str, *tensors):
    dev = DEVICE_OF.get(backend, "cpu")
    return tuple(t.to(dev) if isinstance(t, torch.Tensor) else t for t in tensors)


@contextlib.contextmanager
def triton_tuning(**switches):
    """The Triton backend's active Tuning with ``switches`` changed, active for the block
    (nested blocks add their switches to the outer ones')."""
    from pasa_npu.fallback import triton_tuning as tuning

    with tuning.using(tuning.active().replace(**switches)) as chosen:
        yield chosen


#: Backends that implement a subset of the features and raise NotImplementedError (naming
#: the feature) for the rest; tests skip them for exactly those cases.
PARTIAL_BACKENDS = ("ascendc-emu", "npu")


@contextlib.contextmanager
def skip_unsupported(backend: str):
    """Skip the test, saying why, when a partial backend rejects the case as unsupported."""
    try:
        yield
    except NotImplementedError as exc:
        if backend in PARTIAL_BACKENDS:
            pytest.skip(f"{backend} does not support this case: {exc}")
        raise

# Bounds against the fp64 golden on N(0, 1) inputs, scale 1/sqrt(D), a few
# hundred keys: about 3x the worst value measured over tests/test_golden.py's
# matrix. The floor is one rounding of the output (2**-11 fp16, 2**-8 bf16);
# on top come fp16 scores/statistics and, for pasa and pasa-mixed, gamma (~64 at
# the default beta) times the rounding noise of the fp16 block means, which
# dominates on zero-mean data (measured 3.8e-3 at decode with 1000 keys).
RMSE_BOUND = {
    torch.float16: {"fa-fp32": 1.2e-3, "fa-fp16s": 2e-3, "fa-fp16": 4e-3, "pasa": 1.2e-2,
                    "pasa-mixed": 1.2e-2, "pasa-exact": 2.5e-3},
    torch.bfloat16: {"fa-fp32": 7e-3, "fa-fp16s": 1.5e-2, "fa-fp16": 2.5e-2, "pasa": 1.2e-2,
                     "pasa-mixed": 1.2e-2, "pasa-exact": 5e-3},
}
# Max absolute LSE error (LSE itself is ~5-10 here), same 3x rule.
LSE_BOUND = {
    torch.float16: {"fa-fp32": 1e-5, "fa-fp16s": 3e-3, "fa-fp16": 5e-3, "pasa": 4e-2,
                    "pasa-mixed": 4e-2, "pasa-exact": 3e-3},
    torch.bfloat16: {"fa-fp32": 1e-5, "fa-fp16s": 2e-2, "fa-fp16": 4e-2, "pasa": 4e-2,
                     "pasa-mixed": 4e-2, "pasa-exact": 4e-3},
}


def rel_rmse(actual: torch.Tensor, golden: torch.Tensor) -> float:
    a, g = actual.double(), golden.double()
    return float((a - g).norm() / g.norm().clamp_min(1e-300))


def assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm: str, what: str = "") -> None:
    """A Triton result against the CPU backend's same allocation: finite, relative error of
    the output below 3e-3 (2e-2 for pasa, whose gamma multiplies rounding differences),
    LSE within 2e-2 + 1e-3 relative. The two differ only in fp32 accumulation order and
    the hardware exp."""
    out, lse = out.cpu().float(), lse.cpu()
    assert torch.isfinite(out).all()
    err = (out - ref.float()).norm() / ref.float().norm()
    assert err < (3e-3 if algorithm != "pasa" else 2e-2), f"{what}: {err:.3g}"
    assert torch.allclose(lse, ref_lse, atol=2e-2, rtol=1e-3)


def npu_visible(s1: int, s2: int, sparse_mode: int, pre: int = INT_MAX, nxt: int = INT_MAX,
                q_len: int | None = None, kv_len: int | None = None) -> torch.Tensor:
    """Bool (s1, s2) of computed positions, written from torch_npu's sparse_mode
    table: modes 0/4 keep i - pre <= j <= i + next, with mode 4 (band) and mode 3
    (causal) anchored at the bottom-right corner of the (q_len x kv_len) block and
    mode 2 at the top-left."""
    q_len = s1 if q_len is None else q_len
    kv_len = s2 if kv_len is None else kv_len
    vis = torch.zeros(s1, s2, dtype=torch.bool)
    for i in range(q_len):
        for j in range(kv_len):
            if sparse_mode == 2:
                ok = j <= i
            elif sparse_mode == 3:
                ok = j <= i + (kv_len - q_len)
            elif sparse_mode == 4:
                diag = i + (kv_len - q_len)
                ok = diag - pre <= j <= diag + nxt
            else:
                ok = i - pre <= j <= i + nxt
            vis[i, j] = ok
    return vis


def naive_attention(q, k, v, scale, visible, empty_rows_mean_v=True, kv_lens=None):
    """fp64 softmax attention, BNSD, GQA by repeating K/V. ``visible`` (B|1, S1, S2).
    Rows with no visible key: the mean of V over the valid keys (or zero)."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = torch.einsum("bnid,bnjd->bnij", q, k) * scale
    vis = visible[:, None]
    s = s.masked_fill(~vis, -math.inf)
    any_vis = vis.any(-1, keepdim=True)
    p = torch.softmax(torch.where(any_vis, s, 0.0), dim=-1) * any_vis
    out = p @ v
    if empty_rows_mean_v:
        kv_lens = [k.shape[2]] * k.shape[0] if kv_lens is None else kv_lens
        means = torch.stack([v[b, :, :n].mean(1) if n else torch.zeros_like(v[b, :, 0])
                             for b, n in enumerate(kv_lens)])
        out = torch.where(any_vis, out, means[:, :, None, :])
    return out


def run(q, k, v, algorithm, backend="torch", **kw):
    return pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend=backend, **kw)
