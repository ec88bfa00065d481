"""A call's plan: everything it derives from its arguments but not from tensor contents
(:class:`Plan`), validated by :func:`make_plan` in one pass over the argument layer: the
scalar options, the backend, the tensors' views, the lengths, the mask and band."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from . import backends
from .arguments import Call
from .lengths import capacity_lengths, check_ignored, sequence_lengths
from .masks import mask_and_band, row_facts
from .numerics import ALLOCATIONS, compute_dtype
from .options import (Options, check_flags_and_backend, resolve_allocation, resolve_beta,
                      resolve_options, resolve_tiling)
from .problem import AttentionProblem
from .views import plan_views


@dataclass(frozen=True)
class Plan:
    """Everything a call derives from its arguments but not from tensor contents, validated
    once per distinct argument set (:func:`pasa_npu.plans.plan_for`): the resolved
    ``options``, the lengths and starts (int64 CPU tensors), mask and band, the backend and
    the facts about rows and memory that each call's run reads."""

    options: Options
    beta: float           # PASA's shift fraction (options.resolve_beta; 0 where none shifts)
    q_lens: torch.Tensor
    q_starts: torch.Tensor
    kv_lens: torch.Tensor
    kv_starts: torch.Tensor
    mask: Optional[torch.Tensor]
    band: Optional[tuple[torch.Tensor, torch.Tensor]]
    runner: Callable[[AttentionProblem], None]
    lse_dtype: torch.dtype
    low: torch.dtype      # the compute dtype of the inputs (pasa_npu.numerics.compute_dtype)
    covered: bool         # every output row is written by the backend: no zero fill
    lse_rows_past: bool   # some LSE row lies past its query length
    may_have_empty: bool  # some row inside its query length may see no key
    on_host: bool         # the query's device is the host's memory (problem.host_memory)
    table_on_host: bool   # so is the block table's
    backend: str = "golden"
    mask_source: Optional[torch.Tensor] = None  # sparse modes 0/1: the caller's atten_mask
    checks_mask: bool = False  # sparse modes 2-4 with a mask: each call checks its contents
    backward: bool = True  # the outputs carry autograd; else inputs that require grad raise
    #: the length arguments each call gives on the query's device, left there: the plan's
    #: lengths are then the capacities, and each call's are made on the device by the
    #: backend (:class:`~pasa_npu.problem.DeviceLengths`), with the band of ``band_rule``
    device_lengths: tuple = ()
    band_rule: Optional[tuple] = None  # (sparse_mode, pre_tokens, next_tokens) of the band
    # the backend's state for this plan (AttentionProblem.plan_state); a copy made for other
    # lengths gets its own
    backend_state: dict = field(default_factory=dict, compare=False)
    #: the row flags every repeat of this plan on a GPU writes (:func:`pasa_npu.plans.repeat`),
    #: made by the first, under "row_flags" (a copy made for other lengths shares them: the
    #: query's shape is the same)
    kept: dict = field(default_factory=dict, compare=False)
    #: what every repeat of this plan shares (:class:`pasa_npu.plans.RepeatForm`), made by
    #: the first; a copy made for other lengths gets its own
    repeat_form: Optional[object] = field(default=None, compare=False)
    #: the backend's ``repeat`` (:mod:`pasa_npu.backends`) where this plan's calls may go
    #: straight to it (:func:`pasa_npu.plans.repeat`), else None: no explicit mask that
    #: may empty rows, no LSE row past a query length, no device lengths, no conversion
    #: and no empty output
    repeat: Optional[Callable[[dict, dict], bool]] = None


def make_plan(call: Call, golden: bool, base: Optional[Plan], on_host: bool,
              table_on_host: bool, device_lengths: tuple = ()) -> Plan:
    """The plan of ``call``, or the first error among its arguments, naming the argument.
    ``base``: a plan of the same arguments with other lengths, whose options and backend
    hold (only the lengths, the band they set and the row facts are made anew); None: a
    plan validated in full. The lengths are the host's (:func:`pasa_npu.plans.plan_for`
    reads those given on a device). ``on_host``, ``table_on_host``: the query's and the
    block table's memory (:func:`~pasa_npu.problem.host_memory`). ``device_lengths``: the
    length arguments left on the device (:attr:`Plan.device_lengths`), planned at their
    capacities: the query's S1, the kv axis or the block table's."""
    query = call.query
    if base is not None:
        options, extra = base.options, {}
    else:
        options = resolve_options(call, golden)
        if golden:
            extra = dict(beta=0.0, runner=backends.run_golden, lse_dtype=torch.float64,
                         low=torch.float64)
        else:
            picked_by = ("" if call.algorithm is not None else
                         f", which algorithm=None picks for inner_precise={options.inner_precise}"
                         f" and {query.dtype} inputs")
            beta = resolve_beta(call.beta, options.allocation, options.tiling, options.scale,
                                picked_by)
            backend = backends.resolve(call.backend, query.device)
            if call.learnable_sink is not None and not backend.sinks:
                raise NotImplementedError(f"learnable_sink is not implemented by backend "
                                          f"{backend.name!r} yet (use backend='torch')")
            extra = dict(beta=beta, runner=backend.runner(), lse_dtype=torch.float32,
                         backend=backend.name, backward=backend.backward,
                         low=compute_dtype(options.allocation, query.dtype))
    q, k, v = plan_views(call, options)
    block_size = options.block_size
    s_kv = call.block_table.shape[1] * block_size if block_size else k.shape[2]
    if q.shape[2] == 1 and not options.packed:  # decode ignores actual_seq_lengths' values
        check_ignored(call.actual_seq_lengths, "actual_seq_lengths")
        device_lengths = tuple(n for n in device_lengths if n != "actual_seq_lengths")
    if device_lengths:
        q_lens, q_starts, kv_lens, kv_starts = capacity_lengths(
            call, q, s_kv, options.packed, device_lengths, block_size)
    else:
        q_lens, q_starts, kv_lens, kv_starts = sequence_lengths(call, q, s_kv, options.packed,
                                                                block_size)
    mask, band = mask_and_band(call.atten_mask, options.sparse_mode, options.pre_tokens,
                               options.next_tokens, q_lens.numel(), q.shape[2], s_kv,
                               options.packed, q_lens, kv_lens, query.device)
    if device_lengths:  # the backend applies the row rules (and writes every padded row)
        facts = dict(covered=not options.packed, lse_rows_past=False, may_have_empty=False)
    else:
        facts = row_facts(q_lens, kv_lens, mask, band, options.packed, q.shape[2])
    lengths = dict(q_lens=q_lens, q_starts=q_starts, kv_lens=kv_lens, kv_starts=kv_starts,
                   mask=mask, band=band, device_lengths=device_lengths,
                   band_rule=((options.sparse_mode, options.pre_tokens, options.next_tokens)
                              if device_lengths and band is not None else None),
                   **facts)
    backend_name = base.backend if base is not None else extra.get("backend")
    repeats = (not golden and not device_lengths
               and not facts["may_have_empty"]
               and not (options.want_lse and facts["lse_rows_past"])
               and compute_dtype(options.allocation, query.dtype) == query.dtype
               and q.numel() > 0 and v.shape[3] > 0)
    lengths["repeat"] = backends.BACKENDS[backend_name].repeater() if repeats else None
    if base is not None:
        plan = copy.copy(base)  # dataclasses.replace would cost a third of this function
        plan.__dict__.update(backend_state={}, repeat_form=None, **lengths)
        return plan
    optimized = options.sparse_mode in (2, 3, 4)
    return Plan(options=options, on_host=on_host, table_on_host=table_on_host,
                mask_source=None if optimized else call.atten_mask,
                checks_mask=optimized and call.atten_mask is not None, **lengths, **extra)


def check_own_options(options: dict) -> None:
    """pasa_npu's own keywords (``options``, absent ones at their defaults) checked as far as
    no call decides them, for options given once for many calls: the algorithm's and the
    backend's names, the tiling, the flags' types and a given β's type and range (whether
    β applies is the call's: ``algorithm=None`` picks by ``inner_precise`` and dtype)."""
    algorithm = options.get("algorithm")
    allocation = ALLOCATIONS["pasa"] if algorithm is None else resolve_allocation(algorithm, 0)
    tiling = resolve_tiling(options.get("q_block"), options.get("kv_block"))
    backend = options.get("backend", "auto")
    check_flags_and_backend(options.get("rounding_guard", False),
                            options.get("repair_overflow", True), backend)
    backends.check_name(backend)
    if options.get("beta") is not None:
        resolve_beta(options["beta"], allocation, tiling, 1.0)
