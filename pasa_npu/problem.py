"""The canonical attention problem every backend receives.

The API layer turns torch_npu's arguments (layouts, masks, sparse modes, ragged
and cumulative lengths) into an :class:`AttentionProblem`; backends compute from
it and know nothing of layouts. Tensors are strided views of the caller's
memory in (batch, heads, sequence, dim) order; nothing is transposed or copied.

Visibility of key ``j`` to query row ``i`` of batch ``b`` (local positions):

    i < q_lens[b]  and  j < kv_lens[b]
    and not mask[b, i, j]                       (explicit mask, True = masked)
    and i - pre[b] <= j <= i + next[b]          (band in top-left coordinates)

Paged KV (``block_table`` given): ``key`` and ``value`` are views of the caches as
(num_blocks, Nkv, block_size, D); key position ``j`` of batch ``b`` lives in physical block
``block_table[b, j // block_size]``, row ``j % block_size``; ``kv_starts`` are zero.

With ``sink`` set, row i of query head h computes softmax over its visible scores and the
extra logit ``sink[h]`` (already in scaled-score units), whose value row is zero: the sink
scales the output down and raises the LSE; a row that sees no key ignores it.

Backends write ``out`` (and ``lse`` when given) for every visible row and leave
0 / -inf for rows that see no key; the API layer applies torch_npu's
``inner_precise`` rule to those afterwards. With ``overflow`` set, a backend that detects
overflow also writes the row flags it holds (:mod:`pasa_npu.overflow`).

Paged KV (torch_npu's ``block_table`` and ``block_size``): ``block_table`` is int32
(B, max_blocks) on the query's device and ``block_size`` > 0. ``key`` and ``value`` are
strided views of the caches as (num_blocks, N_kv, block_size, D) (resp. Dv), whichever of
torch_npu's two cache shapes the caller passed, (num_blocks, block_size, N_kv * D) or
(num_blocks, N_kv, block_size, D); nothing is copied. Key position ``j`` of batch ``b``
lives in physical block ``block_table[b, j // block_size]``, row ``j % block_size``.
``kv_lens`` are the per-batch kv lengths and ``kv_starts`` are zero; the query is
(B, Nq, S1, D), or packed (1, Nq, T, D) with ``q_starts`` (TND). The API layer has checked
every table entry of a key below its batch's kv length (``0 <= entry < num_blocks``) and
that the table holds ``ceil(kv_len / block_size)`` entries per batch; entries past those
are never read. Rows of a physical block past a batch's kv length may hold anything (the
cache's other requests, stale data): a backend treats them as absent, as the padding of a
contiguous kv sequence. The numerics are those of the same keys laid out contiguously:
PASA's key shift and pasa-exact's block means are per kv block of ``tiling.kv_block`` keys,
a part-filled last block's taken over its own keys.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from . import paged_kv
from .numerics import ALLOCATIONS, Allocation, Tiling

# The overflow check's row flags (:mod:`pasa_npu.overflow`), which every backend writes.
#: a row's result is finite (or the row sees no key)
ROW_OK = 0
#: noticed non-finite by a backend, not (yet) recomputed
ROW_FLAGGED = 1
#: recomputed by fa-fp32, now finite
ROW_REPAIRED = 2
#: recomputed by fa-fp32 and still not finite: its inputs hold NaN or inf
ROW_NONFINITE = 3


#: band limits as the kernels take them, int32: this stands for "no limit"
BAND_LIMIT = 1 << 30
#: the LSE of a row that sees no key, without row-invalid handling: the kernel's softmax
#: over scores all at the mask's fill value, float32's lowest (log of the count vanishes)
LSE_MASKED_ROW = torch.finfo(torch.float32).min


_KEEPING_NOTHING = contextvars.ContextVar("pasa_npu_keeping_nothing", default=False)


@contextlib.contextmanager
def keeping_nothing():
    """A scope whose calls keep no device tensor they make past the call, not even in the
    package's caches (a compiled call: under mode="reduce-overhead" what it makes lives in a
    CUDA graph's memory pool, which must hold only the graph's outputs)."""
    token = _KEEPING_NOTHING.set(True)
    try:
        yield
    finally:
        _KEEPING_NOTHING.reset(token)


def keeps_device_tensors() -> bool:
    """Whether a call may keep device tensors it makes (in a cache) past itself:
    :func:`keeping_nothing`."""
    return not _KEEPING_NOTHING.get()


def device_cached(maxsize: Optional[int]):
    """Decorator: the device tensor a function makes from its (hashable) arguments, cached
    by them (:func:`functools.lru_cache`, whose ``cache_info`` and ``cache_clear`` it
    keeps), but made anew for a call that keeps nothing (:func:`keeping_nothing`)."""
    def wrap(make):
        cached = functools.lru_cache(maxsize=maxsize)(make)

        @functools.wraps(make)
        def get(*args):
            return cached(*args) if keeps_device_tensors() else make(*args)

        get.cache_info, get.cache_clear = cached.cache_info, cached.cache_clear
        return get
    return wrap


def host_memory(device: torch.device) -> bool:
    """Whether tensors on ``device`` are the host's memory, read without waiting for a device
    (the CPU). The package's one test of it: a tensor on any other device is never read on
    the host where a call can avoid it (docs/design.md, "No host synchronisation")."""
    return device.type == "cpu"


class DeviceLengths(NamedTuple):
    """Length arguments a call gave on the query's device, which the host never reads:
    the caller's 1-D integer tensors (1 entry for every batch, or at least B), None where
    not given; ``band_rule``: (sparse_mode, pre_tokens, next_tokens) of a band whose limits
    follow the lengths (:func:`pasa_npu.masks.band_of_lengths`), or None; ``row_invalid``:
    ``inner_precise`` bit 1, row-invalid handling of the rows an explicit mask empties.

    The problem's ``q_lens`` and ``kv_lens`` then hold the capacities (S1; the kv axis, or
    the block table's columns times ``block_size``) and ``band`` that of the capacities. The
    backend makes each batch's lengths on the device, each given one clamped to [0, its
    capacity] and a kv length also to the keys its table row's leading entries in
    [0, num_blocks) hold (paged); the band of ``band_rule``; and a batch whose given length
    lies outside that range, or whose lengths FIA's token rules refuse
    (:func:`pasa_npu.masks.token_lengths_refused`), is refused. It then applies the row
    rules itself (the API layer cannot, without the lengths), on every row of the outputs:
    rows past a query length output 0, LSE 0 and row flag 0 (``ROW_OK``); rows the band
    and the lengths leave without a key output 0 and LSE +inf; rows that only the explicit
    mask leaves without one the same with ``row_invalid``, else the mean of V over the
    batch's keys and LSE float32's lowest (the API layer's rules, ``outputs.fix_rows``);
    every row of a refused batch NaN in both."""

    q_lens: Optional[torch.Tensor]
    kv_lens: Optional[torch.Tensor]
    band_rule: Optional[tuple]
    row_invalid: bool = False


@dataclass(frozen=True)
class OverflowCheck:
    """The check of one call: ``row_flags`` (uint8, laid out as the canonical output's
    rows (Bt, Nq, Sq), on its device) holds a ``ROW_*`` value for every row the backend
    computed; rows outside the query lengths are never read."""

    row_flags: torch.Tensor


def call_tensors(query, key, value, out, lse=None, row_flags=None, sink=None,
                 block_table=None) -> dict:
    """A call's own tensors by role, as a backend's recorded launches take them
    (:class:`AttentionProblem`'s fields of the same names; ``row_flags``: the
    :class:`OverflowCheck`'s; ``sink`` fp32 on the query's device); the roles a call does
    not have are absent."""
    tensors = dict(query=query, key=key, value=value, out=out)
    for role, t in (("lse", lse), ("row_flags", row_flags), ("sink", sink),
                    ("block_table", block_table)):
        if t is not None:
            tensors[role] = t
    return tensors


@dataclass  # not frozen: a frozen dataclass costs microseconds per call to construct
class AttentionProblem:
    """One forward call, normalised; the backends read it and never assign its fields.

    query (Bt, Nq, Sq, D), key (Bt, Nkv, Skv, D), value (Bt, Nkv, Skv, Dv), out
    (Bt, Nq, Sq, Dv), lse (Bt, Nq, Sq) float32 or None. ``packed``: Bt == 1 and the
    B sequences are consecutive segments of the S axis starting at ``q_starts`` /
    ``kv_starts`` (TND); otherwise Bt == B and the starts are 0. Query head h
    reads kv head h // (Nq // Nkv). Paged: ``block_table`` int32 (B, max_blocks) on the
    query's device and ``block_size`` > 0; key and value are (num_blocks, Nkv, block_size,
    D) views of the caches.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    out: torch.Tensor
    lse: Optional[torch.Tensor]
    q_lens: torch.Tensor
    kv_lens: torch.Tensor
    q_starts: torch.Tensor
    kv_starts: torch.Tensor
    packed: bool
    mask: Optional[torch.Tensor]
    band: Optional[tuple[torch.Tensor, torch.Tensor]]
    scale: float
    allocation: Allocation
    beta: float
    compute_dtype: torch.dtype
    rounding_guard: bool
    tiling: Tiling
    block_table: Optional[torch.Tensor] = None
    block_size: int = 0
    overflow: Optional[OverflowCheck] = None
    #: learnable sinks: (Nq,) float32 on the query's device, one logit per query head that
    #: joins the softmax denominator of every row that sees a key (and its LSE), with a zero
    #: value; None: no sink. Only backends whose ``sinks`` flag is set receive one.
    sink: Optional[torch.Tensor] = None
    #: a dict that lives as long as the call's plan (every call with the same arguments but
    #: the tensors' data): a backend may keep there what it derived from the problem's
    #: shapes, strides, lengths and options, for the plan's later calls; None: nothing kept
    plan_state: Optional[dict] = None
    #: length arguments the call gave on the query's device, never read on the host
    #: (:class:`DeviceLengths`), or None. Only the Triton backend receives them.
    device_lengths: Optional["DeviceLengths"] = None

    @property
    def paged(self) -> bool:
        """K/V are read through ``block_table`` from the (num_blocks, N_kv, block_size, D)
        caches (module docstring)."""
        return self.block_table is not None

    @property
    def batch(self) -> int:
        return int(self.q_lens.numel())

    @property
    def group(self) -> int:
        return self.query.shape[1] // self.key.shape[1]

    @functools.cached_property
    def max_q_len(self) -> int:
        return int(self.q_lens.max()) if self.batch else 0

    @functools.cached_property
    def max_kv_len(self) -> int:
        return int(self.kv_lens.max()) if self.batch else 0

    @property
    def kv_extent(self) -> int:
        """The length of the kv axis the lengths and an explicit mask refer to: the key
        tensor's S, or the table's capacity (max_blocks * block_size) when paged."""
        if self.paged:
            return self.block_table.shape[1] * self.block_size
        return self.key.shape[2]

    def visible(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Bool (B, s1, s2): which keys ``cols`` each query row ``rows`` may attend to."""
        dev = rows.device
        i = rows.view(1, -1, 1)
        j = cols.view(1, 1, -1)
        q_lens = self.q_lens.to(dev).view(-1, 1, 1)
        kv_lens = self.kv_lens.to(dev).view(-1, 1, 1)
        vis = (i < q_lens) & (j < kv_lens)
        if self.band is not None:
            pre, nxt = (t.to(dev).view(-1, 1, 1) for t in self.band)
            vis = vis & (j >= i - pre) & (j <= i + nxt)
        if self.mask is not None:
            m = self.mask
            r = rows.clamp(max=m.shape[1] - 1).to(m.device)
            c = cols.clamp(max=m.shape[2] - 1).to(m.device)
            vis = vis & ~m[:, r][:, :, c].to(dev)
        return vis

    def dense_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query, key, value) as (B, N, S, D) tensors: the views themselves when
        not packed; zero-padded copies of the segments when packed (TND); K and V
        gathered through the block table into zero-padded (B, N_kv, max kv length, D)
        copies when paged."""
        query = _unpack(self.query, self.q_starts, self.q_lens) if self.packed else self.query
        if self.paged:
            return query, self.gather(self.key), self.gather(self.value)
        if not self.packed:
            return query, self.key, self.value
        return (query, _unpack(self.key, self.kv_starts, self.kv_lens),
                _unpack(self.value, self.kv_starts, self.kv_lens))

    def kv_rows(self, t: torch.Tensor, b: int) -> torch.Tensor:
        """(N_kv, kv_lens[b], D): batch ``b``'s keys (or values) of ``t``, a tensor laid
        out as :attr:`key` is (a cache when paged; a copy then)."""
        n = int(self.kv_lens[b])
        if self.paged:
            return self.gather(t, b)[0, :, :n]
        start = int(self.kv_starts[b])
        return t[0 if self.packed else b, :, start:start + n]

    def gather(self, cache: torch.Tensor, batch: Optional[int] = None) -> torch.Tensor:
        """The paged ``cache`` as a zero-padded (B, N_kv, max kv length, D) copy through the
        block table (:func:`pasa_npu.paged_kv.gather`; one batch, (1, ...), when ``batch`` is
        given)."""
        table, lens = self.block_table, self.kv_lens
        if batch is not None:
            table, lens = table[batch:batch + 1], lens[batch:batch + 1]
        return paged_kv.gather(cache, table, lens, self.block_size)

    def write(self, out: torch.Tensor, lse: Optional[torch.Tensor]) -> None:
        """Store dense (B, Nq, maxSq, Dv) results (and (B, Nq, maxSq) LSE) into the
        caller's output views, rows past each batch's query length left at zero."""
        self.scatter_rows(out, self.out)
        if self.lse is not None and lse is not None:
            self.scatter_rows(lse, self.lse)

    def scatter_rows(self, dense: torch.Tensor, target: torch.Tensor) -> None:
        """Copy dense per-row data (B, Nq, maxSq, ...) into ``target``, laid out as the
        canonical output (Bt, Nq, Sq, ...): as it is, or into each packed sequence's rows."""
        if not self.packed:
            target.copy_(dense)
            return
        for b in range(self.batch):
            s, n = int(self.q_starts[b]), int(self.q_lens[b])
            target[0, :, s:s + n].copy_(dense[b, :, :n])


def _unpack(x: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    batch = int(lens.numel())
    width = int(lens.max()) if batch else 0
    dense = x.new_zeros(batch, x.shape[1], width, x.shape[3])
    for b in range(batch):
        s, n = int(starts[b]), int(lens[b])
        dense[b, :, :n] = x[0, :, s:s + n]
    return dense


def fp32_problem(problem: AttentionProblem) -> AttentionProblem:
    """``problem`` computed by fa-fp32 (on its compute-dtype inputs, P rounded to that
    dtype for the P.V matmul), unchecked: the repair of flagged rows."""
    return dataclasses.replace(problem, allocation=ALLOCATIONS["fa-fp32"], beta=0.0,
                               overflow=None, plan_state=None)
