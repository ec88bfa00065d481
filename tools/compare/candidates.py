"""What gets compared: precision allocations x backends, and third-party baselines.

An allocation candidate runs ``pasa_npu.fused_attention(algorithm=..., backend=...)``
on the item (an item's attention sinks applied from the call's LSE, as
``pasa_npu.integrations`` applies gpt-oss's: :meth:`Item.with_sink`); for a PASA allocation it also reports the query rows that the overflow check
recomputed by fa-fp32 (:func:`pasa_npu.overflow_report`; the tool shows them in its
tables, so the call's :class:`pasa_npu.OverflowRepairWarning` is not raised).
Third-party candidates run where installed:

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` in the item's
  dtype on the chosen device (whatever kernel torch picks there); sinks as one more key
  with a zero value whose score is the sink (an additive mask, in the item's dtype);
* ``npu-ip0`` / ``npu-ip1``: ``torch_npu.npu_fused_infer_attention_score`` with
  ``inner_precise`` 0 (high precision) / 1 (high performance), on an NPU.

Backends are discovered through :func:`pasa_npu.backends.available_backends`.
A candidate that cannot run here is reported with the reason, never dropped
silently.
"""
from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

import pasa_npu
from pasa_npu import backends as registry

from .errors import CompareError
from .inputs import Item

THIRD_PARTY = ("sdpa", "npu-ip0", "npu-ip1")


class CandidateOutput(NamedTuple):
    """A candidate's output on an item: (B, Nq, S1, D) in the item's dtype, on CPU, and the
    query rows (of one head each) its overflow check recomputed by fa-fp32, None where the
    call was not checked (fa-* allocations, third-party candidates)."""

    out: torch.Tensor
    repaired_rows: Optional[int] = None


@dataclass(frozen=True)
class Candidate:
    """One implementation to compare. ``allocation``/``backend`` are set for
    pasa_npu candidates, ``None`` for third-party ones."""

    label: str
    allocation: Optional[str] = None
    backend: Optional[str] = None
    device: str = "cpu"
    beta: Optional[float] = None
    rounding_guard: bool = False

    @property
    def third_party(self) -> bool:
        return self.allocation is None

    def run(self, item: Item) -> CandidateOutput:
        """The candidate's :class:`CandidateOutput` for ``item``."""
        if self.label == "sdpa":
            return CandidateOutput(_sdpa(item, self.device))
        if self.label.startswith("npu-ip"):
            return CandidateOutput(_npu(item, int(self.label[-1])))
        q, k, v = (t.to(self.device) for t in (item.query, item.key, item.value))
        kw = item.npu_kwargs()
        if "atten_mask" in kw:
            kw["atten_mask"] = kw["atten_mask"].to(self.device)
        shifted = pasa_npu.ALLOCATIONS[self.allocation].shift == "pseudo_average"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
            out, lse = pasa_npu.fused_attention(q, k, v, algorithm=self.allocation,
                                                backend=self.backend,
                                                beta=self.beta if shifted else None,
                                                rounding_guard=self.rounding_guard,
                                                softmax_lse_flag=item.sink is not None, **kw)
            report = pasa_npu.overflow_report()
            repaired = report.rows if report.checked else None
        if item.sink is not None:
            out = item.with_sink(out.cpu(), lse.cpu()).to(item.dtype)
        return CandidateOutput(out.cpu(), repaired)


def _sdpa(item: Item, device: str) -> torch.Tensor:
    q, k, v = (t.to(device) for t in (item.query, item.key, item.value))
    mask = None if item.mask is None else (~item.mask).unsqueeze(1).to(device)  # True = attend
    if item.sink is not None:  # a key of zeros (score 0) with a zero value, biased by the sink
        b, n, s1, _ = q.shape
        k, v = (torch.cat([t, t.new_zeros(t.shape[:2] + (1, t.shape[3]))], dim=2) for t in (k, v))
        bias = torch.zeros(b if mask is None else mask.shape[0], n, s1, k.shape[2],
                           dtype=q.dtype, device=device)
        if mask is not None:
            bias[..., :-1].masked_fill_(~mask, float("-inf"))
        bias[..., -1] = item.sink.to(device=device, dtype=q.dtype)[:, None]
        mask = bias
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=item.scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.cpu()


def _npu(item: Item, inner_precise: int) -> torch.Tensor:  # pragma: no cover - needs an NPU
    import torch_npu

    q, k, v = (t.to("npu") for t in (item.query, item.key, item.value))
    kw = item.npu_kwargs()
    if "atten_mask" in kw:
        kw["atten_mask"] = kw["atten_mask"].to("npu")
    out, lse = torch_npu.npu_fused_infer_attention_score(q, k, v, inner_precise=inner_precise,
                                                         softmax_lse_flag=item.sink is not None,
                                                         **kw)
    if item.sink is not None:
        return item.with_sink(out.cpu(), lse.cpu()).to(item.dtype)
    return out.cpu()


def third_party_unavailable(name: str, device: str) -> Optional[str]:
    """None when third-party candidate ``name`` can run here, else why not."""
    if name == "sdpa":
        return None
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as err:  # a broken install: say so instead of failing the run
        return f"torch_npu failed to import: {str(err).splitlines()[0] if str(err) else err!r}"
    if not (hasattr(torch, "npu") and torch.npu.is_available()):
        return "torch_npu is installed but no NPU device is visible"
    return None


def build(allocations: list[str], backend_names: Optional[list[str]], third_party: list[str],
          device: str = "cpu", beta: Optional[float] = None, rounding_guard: bool = False,
          ) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates to run and, for those that cannot run here, the reason.

    ``backend_names`` None means every backend available on ``device``. Unknown
    allocation, backend or third-party names, and a backend that was asked for
    by name but is not available here, raise :class:`CompareError`. A name given twice
    counts once.
    """
    allocations, third_party = list(dict.fromkeys(allocations)), list(dict.fromkeys(third_party))
    for name in allocations:
        if name not in pasa_npu.ALGORITHM_NAMES:
            raise CompareError(f"unknown allocation {name!r}; expected one of "
                               f"{', '.join(pasa_npu.ALGORITHM_NAMES)}")
    here = registry.available_backends(device, emulated=True)
    known = [b for b in registry.BACKEND_NAMES if b != "auto"]
    if backend_names is None:  # emulators (Triton's CPU interpreter) only when asked for
        backend_names = registry.available_backends(device)
    backend_names = list(dict.fromkeys(backend_names))
    for name in backend_names:
        if name not in known:
            raise CompareError(f"unknown backend {name!r}; expected one of {', '.join(known)}")
        if name not in here:
            raise CompareError(f"backend {name!r} is not available on {device} here; available: "
                               f"{', '.join(here) or 'none'}")
    for name in third_party:
        if name not in THIRD_PARTY:
            raise CompareError(f"unknown third-party candidate {name!r}; expected one of "
                               f"{', '.join(THIRD_PARTY)}")
    several = len(backend_names) > 1
    candidates = [Candidate(f"{a}@{b}" if several else a, a, b, device, beta, rounding_guard)
                  for b in backend_names for a in allocations]
    skipped = {}
    for name in third_party:
        reason = third_party_unavailable(name, device)
        if reason is None:
            candidates.append(Candidate(name, device="npu" if name.startswith("npu") else device))
        else:
            skipped[name] = reason
    return candidates, skipped
