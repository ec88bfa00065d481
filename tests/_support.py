"""Test support: the backends and devices to test, an independent dense attention and
torch_npu's mask rules written out by hand (so that the package's own visibility logic is
checked, not reused), and the suite's bounds against the golden: a factor times a measured
error (tests/measured.json). Bounds between two implementations of one allocation, derived
from what may round differently, are in tests/_bounds.py ("derived bounds")."""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import pathlib

import pytest
import torch

import pasa_npu
from pasa_npu import compiled
from pasa_npu.backends import available_backends

INT_MAX = 2147483647
#: the L1 bytes Huawei's TPipe hands out per AI Core on Atlas A2 (asc-devkit keeps 128 of 512 KiB)
TPIPE_L1_BYTES = (512 << 10) - 128
#: the measured errors (tests/measure_bounds.py writes them): kind -> key -> value
MEASURED = json.loads((pathlib.Path(__file__).parent / "measured.json").read_text())


def npu_absent_reason() -> str | None:
    """None when an NPU and the ``npu`` backend are here, else why not."""
    try:
        import torch_npu  # noqa: F401
    except ImportError as exc:
        return f"torch_npu does not import ({exc})"
    if not torch.npu.is_available():
        return "torch_npu sees no NPU"
    return None if "npu" in available_backends("npu") else "the npu backend is not built"


# ascendc-sim runs the kernels as ascendc-emu does, through Huawei's implementation of the
# AscendC API on an instruction-level simulator, a few times slower: the suite runs it on the
# golden matrix (test_golden.py), on real shapes whose calls it runs in a few seconds
# (test_ascendc_emu_shapes.py) and against the emulation bit for bit
# (test_ascendc_sim_kernels.py), not in every test of the backends here.
SIM = "ascendc-sim"
#: the AI Cores the simulator models on the golden matrix: every core walks several tasks of
#: its small cases, the schedule of real shapes
SIM_CORES = 2


def _sim_absent() -> str | None:
    """Why the ascendc-sim backend cannot run here (None when it can)."""
    from pasa_npu.backends import BACKENDS as REGISTRY

    backend = REGISTRY[SIM]
    reason = backend.unavailable_reason(torch.device("cpu"))
    if reason is None:
        try:
            backend.runner()
        except ImportError as exc:
            reason = f"backend {SIM!r} does not import ({exc})"
    return reason


SIM_ABSENT = _sim_absent()


def sim_param(*values):
    """A parametrisation entry that runs ascendc-sim, skipped saying why where it cannot run."""
    return pytest.param(*values, marks=pytest.mark.skipif(SIM_ABSENT is not None, reason=str(SIM_ABSENT)))


@contextlib.contextmanager
def sim_cores(backend: str, cores: int = SIM_CORES):
    """For ascendc-sim, the model's AI Cores cut to ``cores`` inside; nothing for other backends."""
    if backend != SIM:
        yield
        return
    from pasa_npu import ascendc_cpu

    with ascendc_cpu.using_model_parameters(dict(ascendc_cpu.model_parameters(), core_num=cores)):
        yield


def _backend_devices() -> list[tuple[str, str]]:
    """(backend, device) pairs to test here: CPU backends on CPU (but ascendc-sim, see above);
    Triton on the GPU when there is one, else through the interpreter on CPU; the npu backend
    on an NPU."""
    pairs = [(name, "cpu") for name in available_backends("cpu", emulated=True) if name != SIM]
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


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def device_kind(backend: str) -> str:
    """Where a backend computes here, as the measurement tables key it: "cpu" (the torch
    backend, the AscendC emulation), "interpreter" (Triton's CPU interpreter) or "cuda"."""
    if interpreted(backend):
        return "interpreter"
    return DEVICE_OF.get(backend, "cpu")


# --------------------------------------------------------------------------- measured bounds
#
# Every error bound of the suite is a factor times the largest error its test measured,
# kept in tests/measured.json. `python tests/measure_bounds.py` reruns the measuring tests
# with PASA_MEASURE set to a log file, to which each of them then appends what it measured,
# and writes the largest value per key back into tests/measured.json.

_MEASURE_FILE = os.environ.get("PASA_MEASURE")


def record(kind: str, key: str, value: float) -> float:
    """Note a measured error (when measuring) and return it."""
    if _MEASURE_FILE:
        line = json.dumps({"kind": kind, "key": key, "value": float(value)}) + "\n"
        with open(_MEASURE_FILE, "a") as f:  # one short append per line: safe across workers
            f.write(line)
    return value


# Not measured here for the GPU (this machine has none). Until python
# tests/measure_bounds.py has run on a CUDA machine and put its "cuda/" keys into
# tests/measured.json, a GPU key takes a stand-in: the measurement of the same computation
# where it runs here times a margin (and at least a floor). The margins cover how the GPU
# differs: its tensor cores accumulate fp32 sums without round-to-nearest (3.1x the RMS
# error of round-to-nearest accumulation on QK^T sums near 1e5, tests/test_paper_cases.py)
# and its exp is the approximate ex2 (2 ulp). Against the golden those are small next to
# the allocations' own roundings (the GPU's paper-case errors are within 1.5x the CPU's,
# tests/test_paper_cases.py). Against the CPU backend in ulps, where they are the whole
# difference, the bounds are derived instead (tests/_bounds.py).
GPU_STAND_IN = {  # kind: (where its stand-in was measured, margin, floor)
    "golden-rmse": ("cpu", 1.5, 0.0),
    "golden-lse": ("cpu", 1.5, 0.0),
    "semantics": ("cpu", 1.5, 0.0),
    "integration": ("cpu", 2.0, 0.0),
}


def measured(kind: str, key: str) -> float:
    """The largest error measured for ``kind`` / ``key`` (tests/measured.json), or for a
    GPU key not measured yet, its stand-in (GPU_STAND_IN)."""
    values = MEASURED.get(kind, {})
    if key in values:
        return values[key]
    stand_in = _gpu_stand_in(kind, key, values) if key.startswith("cuda/") else None
    if stand_in is None:
        raise KeyError(f"no measurement of {kind!r} {key!r} in tests/measured.json: run "
                       f"python tests/measure_bounds.py")
    return stand_in


def _gpu_stand_in(kind: str, key: str, values: dict):
    if kind not in GPU_STAND_IN:
        return None
    where, margin, floor = GPU_STAND_IN[kind]
    here = where + key[len("cuda"):]
    return max(margin * values[here], floor) if here in values else None


def assert_measured(value: float, kind: str, key: str, factor: float, what: str = "") -> None:
    """``value`` within ``factor`` times the largest value measured for ``kind`` / ``key``;
    when measuring (PASA_MEASURE set), only recorded, so that a test records every value
    it measures whatever the old ones were."""
    record(kind, key, value)
    if _MEASURE_FILE:
        return
    bound = factor * measured(kind, key)
    assert value <= bound, (f"{what} {kind} {key}: {value:.4g} exceeds {factor} x the measured "
                            f"{measured(kind, key):.4g}")


def assert_same_in_fp64(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Two fp64 attentions of the same inputs (the golden, the dense one written here) that
    differ only in the order of their fp64 operations: the same NaN and zero rows, the
    largest difference within 4x the largest measured ("fp64-reorder")."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype == torch.float64
    assert torch.equal(torch.isnan(actual), torch.isnan(expected)), what
    diff = float((actual - expected).nan_to_num().abs().max()) if actual.numel() else 0.0
    assert_measured(diff, "fp64-reorder", "cpu/golden-vs-dense", 4, what)


@contextlib.contextmanager
def triton_tuning(**switches):
    """The Triton backend's active Tuning with ``switches`` changed, active for the block
    (nested blocks add their switches to the outer ones')."""
    from pasa_npu.fallback.triton import tuning

    with tuning.using(tuning.active().replace(**switches)) as chosen:
        yield chosen


#: Backends that implement a subset of the features and raise NotImplementedError (naming
#: the feature) for the rest; tests skip them for exactly those cases.
PARTIAL_BACKENDS = ("ascendc-emu", SIM, "npu")


def op_defaults() -> dict:
    """The defaults of the compiled operator's scalar arguments (``compiled.OP_SCALARS``),
    as :func:`pasa_npu.fused_attention` declares them (``out_dtype``: as v2 does): a direct
    call of the operator takes every one."""
    v1 = inspect.signature(pasa_npu.fused_attention).parameters
    v2 = inspect.signature(pasa_npu.fused_attention_v2).parameters
    return {name: (v1 if name in v1 else v2)[name].default for name in compiled.OP_SCALARS}


@contextlib.contextmanager
def skip_unsupported(backend: str):
    """Skip the test, saying why, when a partial backend rejects the case as unsupported."""
    try:
        yield
    except NotImplementedError as exc:
        if backend in PARTIAL_BACKENDS:
            pytest.skip(f"{backend} does not support this case: {exc}")
        raise

def rel_rmse(actual: torch.Tensor, golden: torch.Tensor) -> float:
    a, g = actual.double(), golden.double()
    return float((a - g).norm() / g.norm().clamp_min(1e-300))


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
