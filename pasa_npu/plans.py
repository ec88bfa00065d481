"""The plan cache: everything a call derives from its arguments but not from tensor
contents (layouts, lengths, mask and band, allocation, backend), validated once per distinct
argument set and reused; :func:`attention` runs a call through it."""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from . import backends, overflow, paged_kv, paging
from .arguments import CALL_FIELDS, Call
from .lengths import device_lengths, int_list, read_device_lengths, sequence_lengths
from .masks import mask_and_band, tensor_identity
from .numerics import Allocation, Tiling, compute_dtype
from .options import (MAX_BATCH, MAX_HEAD_DIM, MAX_NBSD_QUERY_LEN, MAX_PACKED_BATCH,
                      canonical_views, check_shapes, check_sink, resolve_beta, resolve_options,
                      to_canonical, to_fp16_checked)
from .outputs import (allocate_lse, allocate_output, fix_rows, lse_placeholder,
                      may_have_empty_rows)
from .problem import AttentionProblem, host_memory


@dataclass(frozen=True)
class Plan:
    """Everything a call derives from its arguments but not from tensor contents:
    validated once per distinct argument set (see :func:`_plan_key`)."""

    in_layout: str
    out_layout: str
    num_heads: int
    num_kv_heads: int
    packed: bool
    q_lens: torch.Tensor
    q_starts: torch.Tensor
    kv_lens: torch.Tensor
    kv_starts: torch.Tensor
    mask: Optional[torch.Tensor]
    band: Optional[tuple[torch.Tensor, torch.Tensor]]
    scale: float
    inner_precise: int
    want_lse: bool
    allocation: Allocation
    beta: float
    tiling: Tiling
    guard: bool
    runner: Callable[[AttentionProblem], None]
    out_dtype: torch.dtype
    lse_dtype: torch.dtype
    low: torch.dtype
    covered: bool         # every output row is written by the backend: no zero fill
    lse_rows_past: bool   # some LSE row lies past its query length
    may_have_empty: bool  # some row inside its query length may see no key
    backend: str = "golden"
    # PASA's results checked for non-finite rows, which the backend repairs (pasa_npu.overflow)
    overflow_check: bool = False
    validated_mask: Optional[torch.Tensor] = None  # sparse modes 2-4: kept alive for the key
    mask_source: Optional[torch.Tensor] = None  # the caller's atten_mask (outputs.fix_rows)
    block_size: int = 0   # paged KV: the cache's block size (0: not paged)
    backward: bool = True  # the outputs carry autograd; else inputs that require grad raise
    # the backend's state for this plan (AttentionProblem.plan_state); a copy made for other
    # lengths gets its own
    backend_state: dict = field(default_factory=dict, compare=False)



#: argument key -> {lengths key -> plan} (see :func:`_plan_key`)
PLANS: dict = {}
_PLAN_CACHE_SIZE = 256      # argument sets
_LENGTHS_PER_PLAN = 64      # actual-length sets per argument set
_SCALAR_TYPES = frozenset((int, float, str, bool))


def clear() -> None:
    """Forget every cached plan (plans hold the backend they resolved)."""
    PLANS.clear()


def attention(call: Call, golden: bool, traced: bool = False):
    """(out, lse) of one call; ``traced`` (the torch.compile operator's body): (out, lse,
    row flags), the flags zero-filled and returned, not recorded (:func:`execute`)."""
    return execute(plan_for(call, golden), call, golden, traced)


def plan_for(call: Call, golden: bool) -> Plan:
    """The plan of a call with ``call``: the cached one, or one made (and cached where the
    call is cacheable, :func:`_plan_key`); its warnings are the caller's. Lengths given on
    the device are read first (:func:`_host_lengths`); the plan holds their values."""
    given = device_lengths(call)
    if given:
        call = _host_lengths(call, given, golden)
    keys = None if golden else _plan_key(call)
    plans = PLANS.get(keys[0]) if keys is not None else None
    plan = plans.get(keys[1]) if plans else None
    if plan is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if plans:  # the same arguments with other lengths: only the lengths are new
                plan = _with_lengths(next(iter(plans.values())), call)
            else:
                plan = _make_plan(call, golden)
        for w in caught:  # re-issued as the caller's; a call that warns is never cached
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if keys is not None and not caught:
            if plans is None:
                if len(PLANS) >= _PLAN_CACHE_SIZE:
                    PLANS.clear()
                plans = PLANS[keys[0]] = {}
            elif len(plans) >= _LENGTHS_PER_PLAN:
                plans.clear()
            plans[keys[1]] = plan
    return plan


def _host_lengths(call: Call, names: tuple[str, ...], golden: bool) -> Call:
    """``call`` with its device-tensor lengths ``names`` read to the host, once (one wait for
    the device: validating them and deriving the launches need their values). Backend
    ``npu`` refuses them instead: it never reads a device tensor, and its operator takes
    host lists, as torch_npu's does."""
    if (not golden and isinstance(call.query, torch.Tensor)
            and backends.resolve(call.backend, call.query.device).name == "npu"):
        name = names[0]
        raise ValueError(f"{name} is a tensor on {getattr(call, name).device}, and backend "
                         f"'npu' takes lengths from the host, as torch_npu's operator does: "
                         f"pass {name} as a list of ints (or a CPU tensor)")
    return read_device_lengths(call, names)


def _plan_key(call: Call):
    """(arguments key, lengths key): a hashable fingerprint of everything
    :func:`_make_plan` reads, or None where a call is not cacheable (explicit masks,
    whose contents the plan holds; device length tensors). The values of the actual
    sequence lengths go in the second key, so that the calls of a decode loop, whose
    lengths grow every step, share the validation of everything else. Types are part
    of the keys, so that ``True`` never hits ``1``."""
    key = []
    lengths = []
    append = key.append
    for name in CALL_FIELDS:
        value = getattr(call, name)
        kind = type(value)
        if value is None or kind in _SCALAR_TYPES:
            append((kind, value))
        elif isinstance(value, torch.Tensor):
            if name in ("query", "key", "value"):
                append((value.shape, value.stride(), value.dtype, value.device))
            elif name == "atten_mask" and call.sparse_mode in (2, 3, 4):
                # only validated there: this very tensor, unchanged since (the plan keeps
                # it alive, so its id is not reused while cached)
                append(tensor_identity(value))
            elif name in ("learnable_sink", "block_table"):  # read (checked) on every call
                append((value.shape, value.dtype, value.device))
            elif name.startswith("actual_seq_lengths") and host_memory(value.device):
                append((value.dtype, value.shape))
                lengths.append(tuple(value.tolist()))
            else:
                return None
        elif kind in (list, tuple):
            entries = tuple((type(x), x) for x in value)
            if name.startswith("actual_seq_lengths"):
                append((kind, len(value)))
                lengths.append(entries)
            else:
                append((kind, entries))
        else:
            append((kind, value))
    keys = (tuple(key), tuple(lengths))
    try:
        hash(keys)
    except TypeError:
        return None
    return keys


def _make_plan(call: Call, golden: bool) -> Plan:
    query = call.query
    options = resolve_options(call, golden)
    block_size = (paging.check_arguments(call.block_table, call.block_size, query.device)
                  if call.block_table is not None or call.block_size != 0 else 0)
    q, k, v = _canonical(call, options.in_layout, options.num_heads, options.num_kv_heads,
                         block_size)
    packed = options.packed
    q_lens, q_starts, kv_lens, kv_starts = _lengths(call, q, k, packed, block_size)
    _check_fia_shapes(call, q, v, packed, options.inner_precise)
    check_sink(call.learnable_sink, options.num_heads, call.input_layout, v.shape[3],
               query.device)
    mask, band = mask_and_band(call, q_lens.numel(), q.shape[2],
                               _kv_extent(call, k, block_size), packed, q_lens, kv_lens,
                               query.device)
    beta = 0.0 if golden else resolve_beta(call.beta, options.allocation, options.tiling,
                                           options.scale)
    if golden:
        runner = backends.run_golden
        out_dtype, lse_dtype, low = torch.float64, torch.float64, torch.float64
        extra = {}
    else:
        backend = backends.resolve(call.backend, query.device)
        if call.learnable_sink is not None and not backend.sinks:
            raise NotImplementedError(f"learnable_sink is not implemented by backend "
                                      f"{backend.name!r} yet (use backend='torch')")
        runner = backend.runner()
        out_dtype, lse_dtype = options.out_dtype, torch.float32
        low = compute_dtype(options.allocation, query.dtype)
        extra = dict(backend=backend.name, overflow_check=options.overflow_check,
                     backward=backend.backward)
    return Plan(
        in_layout=options.in_layout, out_layout=options.out_layout,
        num_heads=options.num_heads, num_kv_heads=options.num_kv_heads, packed=packed,
        q_lens=q_lens, q_starts=q_starts, kv_lens=kv_lens, kv_starts=kv_starts, mask=mask,
        band=band, scale=options.scale, inner_precise=options.inner_precise,
        want_lse=options.want_lse, allocation=options.allocation, beta=beta,
        tiling=options.tiling, guard=options.rounding_guard, runner=runner,
        out_dtype=out_dtype, lse_dtype=lse_dtype, low=low,
        validated_mask=call.atten_mask if call.sparse_mode in (2, 3, 4) else None,
        mask_source=call.atten_mask, block_size=block_size, **extra,
        **_row_flags(q_lens, kv_lens, mask, band, packed, q.shape[2]))


def _check_fia_shapes(call: Call, q, v, packed: bool, inner_precise: int) -> None:
    """FIA's refusals that depend on shapes: a head dim over 512; BNSD_NBSD with a query
    longer than 16; inner_precise 2 or 3 (row-invalid handling) in decode."""
    if not packed and q.shape[0] > MAX_BATCH:
        raise ValueError(f"the batch must be at most {MAX_BATCH} (torch_npu's limit), got "
                         f"{q.shape[0]}")
    if packed and call.actual_seq_lengths is not None:
        count = len(int_list(call.actual_seq_lengths, "actual_seq_lengths"))
        if count > MAX_PACKED_BATCH:
            raise ValueError(f"actual_seq_lengths must have at most {MAX_PACKED_BATCH} entries "
                             f"with packed layouts (torch_npu's limit), got {count}")
    for name, d in (("query", q.shape[3]), ("value", v.shape[3])):
        if d > MAX_HEAD_DIM:
            raise ValueError(f"{name}'s head dim must be at most {MAX_HEAD_DIM} (torch_npu's "
                             f"limit), got {d}")
    if call.input_layout == "BNSD_NBSD" and q.shape[2] > MAX_NBSD_QUERY_LEN:
        raise ValueError(f"input_layout BNSD_NBSD takes a query length of at most "
                         f"{MAX_NBSD_QUERY_LEN} (torch_npu's limit), got {q.shape[2]}")
    if not packed and q.shape[2] == 1 and inner_precise > 1:
        raise ValueError(f"inner_precise must be 0 or 1 in decode (query length 1), as "
                         f"torch_npu requires; got {inner_precise}")


def _canonical(call: Call, layout: str, num_heads: int, num_kv_heads: int, block_size: int):
    """(q, k, v) as the problem takes them: (B, N, S, D) views, K and V as views of the
    (num_blocks, N_kv, block_size, D) caches when paged; shapes checked."""
    query, key, value = call.query, call.key, call.value
    if not block_size:
        q, k, v = canonical_views(query, key, value, layout, num_heads, num_kv_heads)
        check_shapes(q, k, v, layout)
        return q, k, v
    q = to_canonical(query, "query", layout, num_heads)
    k, v = paging.cache_views(key, value, layout, num_kv_heads, block_size)
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"key head dim {k.shape[3]} differs from query head dim {q.shape[3]}")
    return q, k, v


def _kv_extent(call: Call, k: torch.Tensor, block_size: int) -> int:
    """The kv axis' length: K's S, or the block table's capacity when paged."""
    return call.block_table.shape[1] * block_size if block_size else k.shape[2]


def _lengths(call: Call, q, k, packed: bool, block_size: int):
    """(q_lens, q_starts, kv_lens, kv_starts), and torch_npu's block_size rule for them."""
    if not block_size:
        return sequence_lengths(call, q, k.shape[2], packed)
    columns = call.block_table.shape[1]
    lengths = sequence_lengths(call, q, columns * block_size, packed,
                               f"block_table's {columns} blocks of block_size {block_size}")
    decode = (max(lengths[0].tolist(), default=0) if packed else q.shape[2]) <= 1
    paging.check_block_size(block_size, decode)
    return lengths


def _with_lengths(plan: Plan, call: Call) -> Plan:
    """``plan`` (made for the same arguments but other actual sequence lengths) for the
    lengths in ``call``: the lengths, the band they set and the row flags are redone."""
    q, k, _ = _canonical(call, plan.in_layout, plan.num_heads, plan.num_kv_heads,
                         plan.block_size)
    q_lens, q_starts, kv_lens, kv_starts = _lengths(call, q, k, plan.packed, plan.block_size)
    mask, band = mask_and_band(call, q_lens.numel(), q.shape[2],
                               _kv_extent(call, k, plan.block_size), plan.packed, q_lens,
                               kv_lens, call.query.device)
    plan = copy.copy(plan)  # dataclasses.replace would cost a third of this function
    plan.__dict__.update(q_lens=q_lens, q_starts=q_starts, kv_lens=kv_lens, kv_starts=kv_starts,
                         mask=mask, band=band, backend_state={}, **_row_flags(q_lens, kv_lens, mask, band,
                                                            plan.packed, q.shape[2]))
    return plan


def _row_flags(q_lens, kv_lens, mask, band, packed: bool, s_q: int) -> dict:
    """The plan's facts about rows, from the lengths (as Python ints: a decode step's
    worth of tensor operations would cost more than the rest of the lengths)."""
    lens = q_lens.tolist()
    return dict(covered=not packed and all(n == s_q for n in lens),
                lse_rows_past=not packed and any(n < s_q for n in lens),
                may_have_empty=mask is not None or may_have_empty_rows(lens, kv_lens.tolist(),
                                                                        band))


def execute(plan: Plan, call: Call, golden: bool, traced: bool = False):
    """The per-call part: canonical views, the block table's entries, outputs, the backend,
    torch_npu's row rules. ``traced``: the row flags are zero-filled (rows no kernel
    writes read 0) and returned after out and LSE (an empty tensor where the call is not
    checked) for the compiled operator to hand on (:mod:`pasa_npu.compiled`); this
    function keeps no reference to them, as a CUDA graph's memory pool requires."""
    query = call.query
    if not plan.backward and torch.is_grad_enabled():
        for role in ("query", "key", "value"):
            if getattr(call, role).requires_grad:
                raise NotImplementedError(
                    f"backend {plan.backend!r} has no backward pass, and {role} requires grad: "
                    f"use backend='torch', or call under torch.no_grad() or on detached inputs")
    if plan.block_size:
        q = to_canonical(query, "query", plan.in_layout, plan.num_heads)
        k, v = paging.cache_views(call.key, call.value, plan.in_layout,
                                  plan.num_kv_heads, plan.block_size)
    else:
        q, k, v = canonical_views(query, call.key, call.value, plan.in_layout,
                                  plan.num_heads, plan.num_kv_heads)
    convert = plan.low != query.dtype and not golden
    table, kv_starts = None, plan.kv_starts
    if plan.block_size:
        table = paging.table_for_call(call.block_table, plan.kv_lens, k.shape[0],
                                      plan.block_size, query.device)
        if convert:  # bf16 PASA computes in fp16: the used rows, as one converted copy
            k, v, kv_starts = paged_kv.contiguous(k, v, table, plan.kv_lens, plan.block_size,
                                                plan.packed)
            table = None
    v_input = v
    if convert:
        q, k, v = to_fp16_checked((q, k, v), ("query", "key", "value"))

    # every row a backend does not write (past a query length, between packed sequences)
    # must read 0; when every row is written, skip the fill
    out, out_view = allocate_output(q, v, plan.out_layout, plan.out_dtype, zero=not plan.covered)
    lse, lse_view = (allocate_lse(q, plan.packed, plan.lse_dtype) if plan.want_lse
                     else (None, None))
    check = None
    if plan.overflow_check:
        # zero-filled where rows no kernel writes are read: by the compiled operator's
        # caller, and on the CPU, where the report counts the flags at the call
        zeroed = traced or host_memory(out_view.device)
        check = overflow.OverflowCheck((torch.zeros if zeroed else torch.empty)(
            out_view.shape[:3], dtype=torch.uint8, device=out_view.device))
    lse_out = lse if plan.want_lse else lse_placeholder(query.device)
    flags_out = ((check.row_flags if check is not None
                  else torch.empty(0, dtype=torch.uint8, device=query.device)),) if traced else ()
    if q.numel() == 0 or out.numel() == 0:
        if not golden and not traced:
            overflow.record_unchecked(plan.allocation.name, plan.backend)
        return (out, lse_out, *flags_out)

    problem = AttentionProblem(
        query=q, key=k, value=v, out=out_view, lse=lse_view, q_lens=plan.q_lens,
        kv_lens=plan.kv_lens, q_starts=plan.q_starts, kv_starts=kv_starts,
        packed=plan.packed, mask=plan.mask, band=plan.band, scale=plan.scale,
        allocation=plan.allocation, beta=plan.beta, compute_dtype=plan.low,
        rounding_guard=plan.guard, tiling=plan.tiling, block_table=table,
        block_size=plan.block_size if table is not None else 0, overflow=check,
        sink=None if call.learnable_sink is None else call.learnable_sink.to(torch.float32),
        plan_state=None if convert or golden else plan.backend_state)
    plan.runner(problem)
    if not golden and not traced:
        overflow.record(problem, plan.backend)
    fix_rows(problem, v_input, plan)
    return (out, lse_out, *flags_out)
