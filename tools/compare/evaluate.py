"""Run every candidate on every item and measure it against the fp64 golden.

The result is a :class:`Comparison`: per (item, candidate) the metrics of
:func:`pasa_npu.tools.metrics.summary` over the whole output and per head, the
single-benchmark verdict, and the dual-benchmark verdict against the chosen
third-party candidate on the same item; per item, the range of its QK^T scores and the
MERE/MARE of the golden rounded to the item's dtype (the least any output in that dtype
can have).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

import pasa_npu
from pasa_npu.tools import metrics

from . import standards
from .candidates import Candidate
from .errors import CompareError
from .inputs import Item


@dataclass
class Record:
    """One candidate on one item. ``status``: "ok", or "error" with ``reason``."""

    item: str
    candidate: str
    status: str
    reason: str = ""
    metrics: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)
    single: Optional[standards.SingleVerdict] = None
    dual: Optional[standards.DualVerdict] = None
    seconds: float = 0.0
    repaired_rows: Optional[int] = None  # recomputed by the overflow check (PASA only)


@dataclass
class Comparison:
    items: list[dict]                  # name, shape, dtype, scale, masked, scores, meta
    candidates: list[Candidate]
    skipped: dict[str, str]            # candidate label -> why it did not run
    baseline: Optional[str]            # third-party label of the dual-benchmark verdict
    records: list[Record]

    def record(self, item: str, candidate: str) -> Optional[Record]:
        for r in self.records:
            if r.item == item and r.candidate == candidate:
                return r
        return None

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.candidates]


def choose_baseline(requested: str, candidates: list[Candidate], skipped: dict[str, str]
                    ) -> Optional[str]:
    """``auto``: npu-ip0 when it runs, else sdpa, else none; a named third-party
    candidate must be among those that run."""
    running = [c.label for c in candidates if c.third_party]
    if requested == "none":
        return None
    if requested == "auto":
        for name in ("npu-ip0", "sdpa"):
            if name in running:
                return name
        return None
    if requested in running:
        return requested
    if requested in skipped:
        raise CompareError(f"--baseline {requested}: it cannot run here ({skipped[requested]})")
    raise CompareError(f"--baseline {requested!r} is not among the third-party candidates being "
                       f"run ({', '.join(running) or 'none'})")


def compare(items: list[Item], candidates: list[Candidate], skipped: dict[str, str],
            baseline: Optional[str] = None,
            progress: Optional[Callable[[int, int, str], None]] = None) -> Comparison:
    """Run ``candidates`` on ``items``; ``progress(done, total, label)`` after each item."""
    records: list[Record] = []
    item_rows: list[dict] = []
    for i, item in enumerate(items):
        gold, gold_lse = pasa_npu.reference_attention(item.query, item.key, item.value,
                                                      softmax_lse_flag=item.sink is not None,
                                                      **item.npu_kwargs())
        if item.sink is not None:
            gold = item.with_sink(gold, gold_lse)
        rounded = metrics.relative_errors(gold.to(item.dtype), gold)
        item_rows.append({
            "name": item.name, "shape": list(item.shape), "kv_heads": item.key.shape[1],
            "kv_len": item.key.shape[2], "dtype": str(item.dtype).replace("torch.", ""),
            "scale": item.scale, "masked": item.mask is not None, "sinks": item.sink is not None,
            "scores": metrics.score_range(item.query, item.key, item.scale), "meta": item.meta,
            "golden_rounded": {"mere": float(rounded.mean()), "mare": float(rounded.max())},
        })
        item_records = {}
        for cand in candidates:
            start = time.perf_counter()
            try:
                out, repaired = cand.run(item)
            except (ValueError, RuntimeError, NotImplementedError, TypeError) as err:
                rec = Record(item.name, cand.label, "error", f"{type(err).__name__}: {err}")
            else:
                rec = Record(item.name, cand.label, "ok", metrics=metrics.summary(out, gold),
                             heads=metrics.per_head(out, gold), repaired_rows=repaired)
                rec.single = standards.single_benchmark(rec.metrics["mere"], rec.metrics["mare"],
                                                        item.dtype)
            rec.seconds = time.perf_counter() - start
            item_records[cand.label] = rec
        base = item_records.get(baseline) if baseline else None
        for rec in item_records.values():
            if rec.status != "ok" or base is None or rec.candidate == baseline:
                continue
            if base.status != "ok":
                rec.dual = standards.DualVerdict("n/a", (float("nan"),) * 3,
                                                 f"{baseline} failed: {base.reason}")
                continue
            key = lambda m: (m["mare"], m["mere"], m["rmse"])  # noqa: E731
            rec.dual = standards.dual_benchmark(key(rec.metrics), key(base.metrics))
        records.extend(item_records.values())
        if progress:
            progress(i + 1, len(items), item.name)
    return Comparison(item_rows, list(candidates), dict(skipped), baseline, records)


def check_finite_inputs(items: list[Item]) -> None:
    for item in items:
        for role, t in (("query", item.query), ("key", item.key), ("value", item.value)):
            if not bool(torch.isfinite(t).all()):
                raise CompareError(f"{item.name}: {role} holds NaN or Inf after conversion to "
                                   f"{item.dtype} (values out of range for it?)")
