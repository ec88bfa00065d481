"""The plan cache and the run: :func:`plan_for` finds a call's
:class:`~pasa_npu.planner.Plan` (made and validated once per distinct argument set, then
reused), and :func:`run` runs a call through its plan: straight into the launches its
backend recorded (:func:`repeat`) where it can, else in full (:func:`execute`);
:func:`attention` does both."""
from __future__ import annotations

import collections
import functools
import warnings
from typing import Optional

import torch

from . import backends, overflow
from .arguments import (LENGTH_ARGUMENTS, Call, call_key, caller_stacklevel, has_signature,
                        signature_of)
from .lengths import read_device_lengths
from .masks import check_optimized_mask
from .numerics import to_fp16_checked
from .options import PACKED
from .paging import PREFILL_BLOCK_ALIGN
from .outputs import (allocate_lse, allocate_output, fix_rows, lse_placeholder,
                      shared_lse_placeholder)
from .planner import Plan, make_plan
from .problem import (AttentionProblem, DeviceLengths, OverflowCheck, call_tensors, host_memory,
                      keeping_nothing, keeps_device_tensors)
from .views import call_inputs, unchecked_view

__all__ = ["Plan", "PLANS", "clear", "attention", "plan_for", "run", "repeat", "execute"]


#: argument key -> {lengths key -> plan} (see :func:`~pasa_npu.arguments.call_key`)
PLANS: dict = {}
_PLAN_CACHE_SIZE = 256      # argument sets
_LENGTHS_PER_PLAN = 64      # actual-length sets per argument set
#: argument keys whose plans hold a caller's full mask (sparse modes 0/1), oldest first: at
#: most _FULL_MASK_PLANS of them stay cached, so that the cache holds few S1 x S2 masks alive
_FULL_MASK_KEYS: collections.deque = collections.deque()
_FULL_MASK_PLANS = 8


#: the plans of the two most recent calls of scalar arguments (call_key's common case), the
#: latest first, each as (the signature in its key, :func:`~pasa_npu.arguments.signature_of`,
#: plan): a call with one of those signatures takes that plan without building its key (a
#: model's layers alternate between at most two argument sets: self- and cross-attention)
_RECENT: list = [None, None]


def clear() -> None:
    """Forget every cached plan (plans hold the backend they resolved)."""
    PLANS.clear()
    _FULL_MASK_KEYS.clear()
    _RECENT[:] = [None, None]


def attention(call: Call, golden: bool, traced: bool = False):
    """(out, lse) of one call; ``traced`` (the torch.compile operator's body): (out, lse,
    row flags), the flags zero-filled and returned, not recorded (:func:`execute`), and no
    device tensor the call makes kept past it (:func:`~pasa_npu.problem.keeping_nothing`)."""
    if traced:
        with keeping_nothing():
            return execute(plan_for(call, golden), call, golden, traced)
    return run(plan_for(call, golden), call, golden)


def run(plan: Plan, call: Call, golden: bool = False):
    """(out, lse) of ``call`` through its ``plan``: :func:`repeat` where the plan's backend
    repeats its calls, else (or where it declines) :func:`execute`."""
    if plan.repeat is not None:
        result = repeat(plan, call)
        if result is not None:
            return result
    return execute(plan, call, golden)


def plan_for(call: Call, golden: bool) -> Plan:
    """The plan of a call with ``call``: the cached one, or one made (and cached where the
    call is cacheable, :func:`~pasa_npu.arguments.call_key`); its warnings are the
    caller's. Lengths given on the device stay there where :func:`lengths_stay_on_device`
    says so (a cached plan under their key is one that keeps them there); else they are
    read first, in one transfer (the one wait for the device that they cost: the plan
    validates them and derives the launches from them), except by backend ``npu``, which
    refuses them: it never reads a device tensor, and its operator takes host lists, as
    torch_npu's does."""
    if not golden:
        recent = _RECENT[0]
        if recent is not None and has_signature(call, recent[0]):
            return _checked(recent[1], call)
        older = _RECENT[1]
        if older is not None and has_signature(call, older[0]):
            _RECENT[:] = older, recent
            return _checked(older[1], call)
    keys, plans, plan = _cached(call, golden)
    if plan is not None:
        _remember(keys, plan)
        return _checked(plan, call)
    query = call.query
    on_device = tuple(name for name in LENGTH_ARGUMENTS
                      if isinstance(getattr(call, name), torch.Tensor)
                      and not host_memory(getattr(call, name).device))
    if on_device:
        for name in on_device:
            device = getattr(call, name).device
            if isinstance(query, torch.Tensor) and device != query.device:
                raise ValueError(f"{name} is on {device} but query is on {query.device}: give "
                                 f"lengths on the query's device or on the host")
        backend = (backends.resolve(call.backend, query.device).name
                   if not golden and isinstance(query, torch.Tensor) else None)
        if backend == "npu":
            name = on_device[0]
            raise ValueError(f"{name} is a tensor on {getattr(call, name).device}, and backend "
                             f"'npu' takes lengths from the host, as torch_npu's operator "
                             f"does: pass {name} as a list of ints (or a CPU tensor)")
        if not lengths_stay_on_device(call, backend):
            call = read_device_lengths(call, on_device)
            on_device = ()
            keys, plans, plan = _cached(call, golden)
            if plan is not None:
                return _checked(plan, call)
    table = call.block_table
    on_host = not isinstance(query, torch.Tensor) or host_memory(query.device)
    table_on_host = not isinstance(table, torch.Tensor) or host_memory(table.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the same arguments with other lengths: only the lengths are new
        plan = make_plan(call, golden, next(iter(plans.values())) if plans else None,
                         on_host, table_on_host, on_device)
    for w in caught:  # re-issued as the caller's; a call that warns is never cached
        warnings.warn(w.message, w.category, stacklevel=caller_stacklevel())
    if keys is not None and not caught:
        if plans is None:
            if len(PLANS) >= _PLAN_CACHE_SIZE:
                clear()
            plans = PLANS[keys[0]] = {}
            if call.atten_mask is not None and plan.options.sparse_mode in (0, 1):
                _FULL_MASK_KEYS.append(keys[0])
                if len(_FULL_MASK_KEYS) > _FULL_MASK_PLANS:
                    PLANS.pop(_FULL_MASK_KEYS.popleft(), None)
                    _RECENT[:] = [None, None]
        elif len(plans) >= _LENGTHS_PER_PLAN:
            plans.clear()
        plans[keys[1]] = plan
        _remember(keys, plan)
    return plan


def _checked(plan: Plan, call: Call) -> Plan:
    """``plan``, cached, for ``call``: its optimized mask checked (sparse modes 2-4; the
    plan's key holds the mask's shape, dtype and device, not the tensor)."""
    if plan.checks_mask:
        check_optimized_mask(call.atten_mask, plan.options.sparse_mode)
    return plan


def _remember(keys: Optional[tuple], plan: Plan) -> None:
    """Make ``plan``, cached under ``keys``, the most recent of :data:`_RECENT` where its
    call's arguments are scalars (call_key's common case)."""
    signature = signature_of(keys)
    if signature is not None:
        _RECENT[:] = (signature, plan), _RECENT[0]


def _cached(call: Call, golden: bool) -> tuple:
    """(the call's keys, the plans cached under its arguments key, the plan for its lengths
    key), each None where there is none (:func:`~pasa_npu.arguments.call_key`)."""
    keys = None if golden else call_key(call)
    plans = PLANS.get(keys[0]) if keys is not None else None
    return keys, plans, plans.get(keys[1]) if plans else None


def lengths_stay_on_device(call: Call, backend) -> bool:
    """Whether a call's length arguments given on its device stay there, unread on the host
    (:attr:`~pasa_npu.planner.Plan.device_lengths`): on the Triton backend (``backend``,
    resolved), with no explicit mask where the rows it empties would take the mean of V
    from a paged cache or a bf16 input, no paged rows to copy (bf16 PASA), no length
    argument on the host, and, packed with a block table, a block size that torch_npu
    takes whatever the query lengths. Other calls read them once
    (:func:`~pasa_npu.lengths.read_device_lengths`)."""
    if backend != "triton" or not isinstance(call.input_layout, str):
        return False
    packed = call.input_layout.split("_")[0] in PACKED
    if packed and call.block_table is not None and not (
            isinstance(call.block_size, int) and call.block_size % PREFILL_BLOCK_ALIGN == 0):
        return False  # which block sizes torch_npu takes depends on the query lengths
    if call.atten_mask is not None and call.sparse_mode not in (2, 3, 4) and (
            call.block_table is not None or call.query.dtype != torch.float16):
        return False  # the rows the mask empties take the mean of the input V
    if any(isinstance(value, (list, tuple)) or host_memory(value.device)
           for value in (getattr(call, name) for name in LENGTH_ARGUMENTS)
           if value is not None):
        return False  # one of them on the host: all are read there
    return call.block_table is None or call.query.dtype == torch.float16


def repeat(plan: Plan, call: Call):
    """(out, lse) of a call whose plan's backend repeats what it recorded
    (:attr:`~pasa_npu.planner.Plan.repeat`): the outputs and row flags allocated as
    :func:`execute` allocates them and handed to the backend with the call's views (and its
    block table, checked as :func:`execute` checks it), with no problem built; None, having
    launched nothing, where the call must go through :func:`execute` (inputs that require
    grad on a backend without backward, a scope that keeps nothing, nothing recorded, or
    no record that fits it)."""
    if not plan.backend_state:
        return None  # nothing recorded yet
    query, key, value = call.query, call.key, call.value
    sink = call.learnable_sink
    if not plan.backward and torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
            or (sink is not None and sink.requires_grad)):
        return None  # execute raises
    if not keeps_device_tensors():
        return None
    options = plan.options
    form = plan.repeat_form
    view = form.view if form is not None else None
    if view is not None:
        q, k, v, table = (view(query, options.num_heads), view(key, options.num_kv_heads),
                          view(value, options.num_kv_heads), None)
    else:
        q, k, v, table, _ = call_inputs(
            call, options.in_layout, options.num_heads, options.num_kv_heads,
            options.block_size, plan.kv_lens, plan.kv_starts, options.packed, False,
            plan.table_on_host, plan.on_host)
        if form is None:  # the plan's cache of it (the plan itself is frozen)
            form = RepeatForm(plan, query, q, v)
            object.__setattr__(plan, "repeat_form", form)
    if form.out_like_query:
        out = torch.empty_like(query)
        out_view, lse_out, lse_view = (form.view(out, options.num_heads),
                                       shared_lse_placeholder(out.device), None)
    else:
        out, out_view, lse_out, lse_view = _outputs(plan, q, v, shared_lse_placeholder)
    check = form.check if form.pending is not None else _repeat_overflow_check(plan, out_view)
    sink = call.learnable_sink
    if not plan.repeat(plan.backend_state, call_tensors(
            q, k, v, out_view, lse_view, None if check is None else check.row_flags,
            None if sink is None else sink.to(query.device, torch.float32), table)):
        return None
    if form.pending is not None:
        overflow.record_pending(form.pending)
    else:
        overflow.record_check(options.allocation.name, plan.backend, check, form.rows)
    return out, lse_out


class RepeatForm:
    """What every :func:`repeat` of one plan's calls shares, made at its first (on the
    call's ``query`` and the canonical views ``q`` and ``v``): ``view``, the canonical
    view of the inputs (None where a block table is checked per call);
    ``out_like_query``, whether the output is made as ``torch.empty_like(query)`` (one
    layout in and out, the same shape, dtype and contiguous strides, every row written,
    no LSE); ``rows``, the rows an overflow report counts (q_starts, q_lens, packed,
    q_block); ``check`` and ``pending``, the plan's overflow check on a GPU and its report
    (both None where each call makes its own)."""

    __slots__ = ("view", "out_like_query", "rows", "check", "pending")

    def __init__(self, plan: Plan, query: torch.Tensor, q: torch.Tensor, v: torch.Tensor):
        options = plan.options
        self.view = None if options.block_size else unchecked_view(options.in_layout)
        self.out_like_query = (
            self.view is not None and options.out_layout == options.in_layout
            and not options.want_lse and plan.covered and query.is_contiguous()
            and options.out_dtype == query.dtype and v.shape[3] == q.shape[3])
        self.rows = (plan.q_starts, plan.q_lens, options.packed, options.tiling.q_block)
        self.check = self.pending = None
        if options.overflow_check and not plan.on_host and plan.covered:
            self.check = _repeat_overflow_check(plan, q)  # the plan's flags: (Bt, Nq, Sq)
        if self.check is not None or not options.overflow_check:
            self.pending = overflow.pending_check(options.allocation.name, plan.backend,
                                                  self.check, self.rows)


def _outputs(plan: Plan, q: torch.Tensor, v: torch.Tensor, placeholder=lse_placeholder) -> tuple:
    """(out in the output layout, its canonical view, the LSE as the call returns it, its
    canonical view or None) of a call with canonical ``q`` and ``v``; ``placeholder``
    makes the LSE returned without ``softmax_lse_flag``. Every row a backend does not
    write (past a query length, between packed sequences) must read 0; where every row is
    written, the fill is skipped."""
    options = plan.options
    out, out_view = allocate_output(q, v, options.out_layout, options.out_dtype,
                                    zero=not plan.covered)
    if not options.want_lse:
        return out, out_view, placeholder(q.device), None
    lse, lse_view = allocate_lse(q, options.packed, plan.lse_dtype)
    return out, out_view, lse, lse_view


def _overflow_check(plan: Plan, out_view: torch.Tensor, traced: bool = False):
    """The call's :class:`OverflowCheck`, or None where it is not checked. Its row flags are
    zero-filled where rows no kernel writes are read: by the compiled operator's caller
    (``traced``), on the CPU, where the report counts the flags at the call, and where some
    rows lie outside every sequence."""
    if not plan.options.overflow_check:
        return None
    new = torch.zeros if traced or plan.on_host or not plan.covered else torch.empty
    return OverflowCheck(new(out_view.shape[:3], dtype=torch.uint8, device=out_view.device))


def _repeat_overflow_check(plan: Plan, out_view: torch.Tensor):
    """:func:`_overflow_check` for a :func:`repeat`: on a GPU, where every row is written,
    the row flags are the plan's, one tensor that each of its repeats writes anew (the
    report of a call counts them when asked for, before the next call:
    :func:`~pasa_npu.overflow.overflow_report`)."""
    if not plan.options.overflow_check or plan.on_host or not plan.covered:
        return _overflow_check(plan, out_view)
    flags = plan.kept.get("row_flags")
    if flags is None:
        flags = plan.kept["row_flags"] = _overflow_check(plan, out_view).row_flags
    return OverflowCheck(flags)


def _rows_in_use(plan: Plan, kv_starts: torch.Tensor, index: int,
                 t: torch.Tensor) -> torch.Tensor:
    """The rows of the canonical view ``t`` (the query for ``index`` 0, else a key or value)
    that lie within their batch's length, flattened: those a kernel reads."""
    lens, starts = (plan.q_lens, plan.q_starts) if index == 0 else (plan.kv_lens, kv_starts)
    return torch.cat([t[0 if plan.options.packed else b, :, start:start + n].flatten()
                      for b, (n, start) in enumerate(zip(lens.tolist(), starts.tolist()))])


def execute(plan: Plan, call: Call, golden: bool, traced: bool = False):
    """The per-call part: canonical views, the block table's entries, outputs, the backend,
    torch_npu's row rules. ``traced``: the row flags are zero-filled (rows no kernel
    writes read 0) and returned after out and LSE (an empty tensor where the call is not
    checked) for the compiled operator to hand on (:mod:`pasa_npu.compiled`); this
    function keeps no reference to them, as a CUDA graph's memory pool requires."""
    query, options = call.query, plan.options
    if not plan.backward and torch.is_grad_enabled():
        for role in ("query", "key", "value", "learnable_sink"):
            tensor = getattr(call, role)
            if tensor is not None and tensor.requires_grad:
                raise NotImplementedError(
                    f"backend {plan.backend!r} has no backward pass, and {role} requires grad: "
                    f"use backend='torch', or call under torch.no_grad() or on detached inputs")
    convert = plan.low != query.dtype and not golden
    # bf16 PASA computes in fp16: paged rows in use as one converted copy
    q, k, v, table, kv_starts = call_inputs(
        call, options.in_layout, options.num_heads, options.num_kv_heads, options.block_size,
        plan.kv_lens, plan.kv_starts, options.packed, convert, plan.table_on_host,
        plan.on_host, bool(plan.device_lengths))
    v_input = v
    if convert:
        q, k, v = to_fp16_checked((q, k, v), ("query", "key", "value"),
                                  None if plan.device_lengths else functools.partial(
                                      _rows_in_use, plan, kv_starts))

    out, out_view, lse_out, lse_view = _outputs(plan, q, v)
    if q.numel() == 0 or out.numel() == 0:
        if not golden and not traced:
            overflow.record_unchecked(options.allocation.name, plan.backend)
        flags = (torch.zeros(out_view.shape[:3], dtype=torch.uint8, device=out_view.device)
                 if options.overflow_check
                 else torch.empty(0, dtype=torch.uint8, device=query.device))
        return (out, lse_out, flags) if traced else (out, lse_out)
    check = _overflow_check(plan, out_view, traced)
    problem = AttentionProblem(
        query=q, key=k, value=v, out=out_view, lse=lse_view, q_lens=plan.q_lens,
        kv_lens=plan.kv_lens, q_starts=plan.q_starts, kv_starts=kv_starts,
        packed=options.packed, mask=plan.mask, band=plan.band, scale=options.scale,
        allocation=options.allocation, beta=plan.beta, compute_dtype=plan.low,
        rounding_guard=options.rounding_guard, tiling=options.tiling, block_table=table,
        block_size=options.block_size if table is not None else 0, overflow=check,
        sink=None if call.learnable_sink is None else call.learnable_sink.to(torch.float32),
        device_lengths=(DeviceLengths(*[getattr(call, name) if name in plan.device_lengths
                                        else None for name in LENGTH_ARGUMENTS],
                                      plan.band_rule, bool(options.inner_precise & 2))
                        if plan.device_lengths else None),
        # a call that keeps nothing records nothing for the plan's later calls either
        plan_state=(plan.backend_state if not (convert or golden) and keeps_device_tensors()
                    else None))
    plan.runner(problem)
    if not golden and not traced:
        overflow.record(problem, plan.backend)
    fix_rows(problem, v_input, plan)
    if not traced:
        return out, lse_out
    return out, lse_out, (check.row_flags if check is not None
                          else torch.empty(0, dtype=torch.uint8, device=query.device))
