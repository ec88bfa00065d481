"""The operator-level precision comparison tool (``pasa-compare``).

Python API::

    from pasa_npu.tools.compare import (Item, case_item, file_item, build_candidates,
                                        compare, record_attention, items_from_captures)
    items = [case_item(case, shape=(1, 4, 1280, 128)) for case in sweep_cases()]
    cands, skipped = build_candidates(["fa-fp16s", "pasa-exact"], None, ["sdpa"])
    comparison = compare(items, cands, skipped, baseline="sdpa")

Modules: ``inputs`` (generated and file inputs), ``capture`` (Hugging Face),
``candidates``, ``evaluate`` (metrics and verdicts per item and candidate),
``standards`` (Ascend MERE/MARE and ratio verdicts), ``report``, ``plots``,
``bias`` (the rounding-bias experiment), ``cli``.
"""
from .candidates import Candidate
from .candidates import build as build_candidates
from .errors import CompareError
from .evaluate import Comparison, Record, compare
from .inputs import Item, case_item, file_item, sweep_cases
from .standards import dual_benchmark, single_benchmark

__all__ = ["Candidate", "build_candidates", "CompareError", "Comparison", "Record", "compare",
           "Item", "case_item", "file_item", "sweep_cases", "dual_benchmark", "single_benchmark"]


def record_attention(*args, **kwargs):
    """See :func:`pasa_npu.tools.compare.capture.record_attention` (needs transformers)."""
    from .capture import record_attention as impl
    return impl(*args, **kwargs)


def items_from_captures(*args, **kwargs):
    from .capture import items_from_captures as impl
    return impl(*args, **kwargs)
