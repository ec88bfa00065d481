"""Pieces the GPU kernels share, the Triton kernels (``triton.prefill``, ``triton.decode``,
``triton.shift``) and the warp-specialised Gluon kernel (``gluon.prefill``): the kv blocks
a query tile visits, the fp16 roundings, the allocation's flags as constexprs, the strides
a TMA descriptor takes, small host helpers, the direct launch and the recorded call that a
plan repeats. Gluon kernels call these ``triton.jit`` helpers as they are (scalar and
element-wise code has no layout of its own)."""
from __future__ import annotations

import functools
import math
import operator
import os
import threading
import weakref
from typing import Optional

import torch
import triton
import triton.language as tl

from pasa_npu.fallback import capture_counters, graph_update
from pasa_npu.problem import device_cached, keeps_device_tensors

#: the kernels run in the interpreter (decided at import, as triton.jit decides it)
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def allocation_flags(allocation) -> dict:
    """The allocation's named properties (:class:`pasa_npu.numerics.Allocation`) as the
    ``tl.constexpr`` booleans the Triton kernels take."""
    return dict(PSEUDO_AVERAGE_SHIFT=allocation.pseudo_average_shift,
                EXACT_SHIFT=allocation.exact_shift, LOW_SCORES=allocation.low_scores,
                LOW_STATISTICS=allocation.low_statistics,
                LOW_ACCUMULATOR=allocation.low_accumulator)


@triton.jit
def _page_rows(pages, n0, cols, kv_len, page_size, WHOLE_PAGE: tl.constexpr):
    """Paged KV: the physical block (``pages``: the batch's row of the block table) and the
    row in it of keys n0 + cols, as int64 offsets to scale by the caches' strides. A scalar
    block where BLOCK_N keys never straddle two (WHOLE_PAGE: BLOCK_N divides the block
    size), else one per key; keys past ``kv_len`` read entry 0's block, and are masked."""
    if WHOLE_PAGE:
        page = tl.load(pages + n0 // page_size).to(tl.int64)
        rows = (n0 % page_size + cols).to(tl.int64)
    else:
        n = n0 + cols
        page = tl.load(pages + n // page_size, mask=n < kv_len, other=0).to(tl.int64)
        rows = (n % page_size).to(tl.int64)
    return page, rows


@triton.jit
def kv_row_offsets(pages, n0, cols, kv_len, page_size, stride_kb, stride_ks, stride_vb, stride_vs,
             PAGED: tl.constexpr, WHOLE_PAGE: tl.constexpr):
    """The int64 offsets, in K and in V, of keys n0 + cols from the (batch, kv head)'s
    base: through the batch's row ``pages`` of the block table (:func:`_page_rows`) where
    PAGED, else rows of the contiguous sequence (``pages`` unread)."""
    if PAGED:
        page, rows = _page_rows(pages, n0, cols, kv_len, page_size, WHOLE_PAGE)
        k_rows = page * stride_kb + rows * stride_ks
        v_rows = page * stride_vb + rows * stride_vs
    else:
        n = (n0 + cols).to(tl.int64)
        k_rows = n * stride_ks
        v_rows = n * stride_vs
    return k_rows, v_rows


@triton.jit
def round_low(x, low: tl.constexpr):
    """One rounding to the compute dtype ``low``, kept in fp32 (a low-precision step)."""
    return x.to(low).to(tl.float32)


@triton.jit
def to_fp16_paired(x):
    """fp32 -> fp16, round to nearest even, two elements per instruction. The compiler
    converts a tile that stays in registers one element at a time (and then packs pairs
    for the fp16 arithmetic); ``cvt.rn.f16x2.f32`` halves that. Same values."""
    if INTERPRET:
        return x.to(tl.float16)
    else:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def tile_kv_blocks(m0, q_len, kv_len, band_pre, band_next, b, HAS_BAND: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The kv blocks [lo, hi) the query tile of rows m0 .. m0+BLOCK_M-1 can see, the
    interior ones [full_lo, full_hi) every valid row sees whole, and the band limits
    (pre, next) of batch b (0 without a band)."""
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo_col = kv_len * 0
    hi_col = kv_len
    full_lo_col = lo_col
    full_hi_col = kv_len
    pre = lo_col
    nxt = lo_col
    if HAS_BAND:
        pre = tl.load(band_pre + b)
        nxt = tl.load(band_next + b)
        lo_col = tl.maximum(lo_col, m0 - pre)
        hi_col = tl.minimum(hi_col, m_last + nxt + 1)
        full_lo_col = tl.maximum(full_lo_col, m_last - pre)
        full_hi_col = tl.minimum(full_hi_col, m0 + nxt + 1)
    lo = lo_col // BLOCK_N
    hi = tl.maximum((hi_col + BLOCK_N - 1) // BLOCK_N, lo)
    full_lo = tl.minimum(tl.maximum((full_lo_col + BLOCK_N - 1) // BLOCK_N, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi_col // BLOCK_N, full_lo), hi)
    return lo, hi, full_lo, full_hi, pre, nxt


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host (``triton.cdiv`` is a constexpr function, slow to call)."""
    return -(-a // b)


def pow2(n: int, floor: int = 16) -> int:
    """The power of two at or above ``n``, at least ``floor`` (a tile extent)."""
    return max(floor, 1 << (max(n, 1) - 1).bit_length())


def interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter."""
    return INTERPRET.value


@device_cached(maxsize=16)
def placeholder(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A never-read stand-in for an absent tensor argument (no mask, no LSE, ...)."""
    return torch.zeros(1, 1, 1, dtype=dtype, device=device)


def mask_argument(mask, dev):
    """The explicit mask as uint8 (a view of a bool mask, no copy) and its strides."""
    if mask is None:
        return placeholder(dev, torch.uint8), (0, 0, 0)
    mask = mask.to(dev)
    mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)
    return mask, (mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(1), mask.stride(2))


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """The number of SMs of CUDA device ``device_index``."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


_RESIDENT: dict = {}


def resident_programs(kernel, device_index: int, args: tuple, kwargs: dict) -> int:
    """How many programs of ``kernel``, compiled for ``args`` and ``kwargs``, CUDA device
    ``device_index`` holds at once: its SMs times the programs per SM that the compiled
    kernel's shared memory (plus the 1 KiB the hardware reserves per block), registers
    (allocated 8 per thread at a time) and threads allow. A grid of that many programs runs
    in one wave, so one whose programs all return at once costs one wave, not several.
    Compiles on the first call per kernel, device, argument dtypes and constexprs."""
    key = (kernel, device_index, *(getattr(a, "dtype", None) for a in args),
           *sorted(kwargs.items()))
    count = _RESIDENT.get(key)
    if count is None:
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
        compiled._init_handles()
        props = torch.cuda.get_device_properties(device_index)
        threads = 32 * compiled.metadata.num_warps
        limits = [getattr(props, "max_threads_per_multi_processor", threads) // threads,
                  getattr(props, "regs_per_multiprocessor", 0)
                  // (threads * -(-max(compiled.n_regs, 1) // 8) * 8)]
        if compiled.metadata.shared:
            limits.append(getattr(props, "shared_memory_per_multiprocessor", 0)
                          // (compiled.metadata.shared + 1024))
        count = _RESIDENT[key] = props.multi_processor_count * max(min(limits), 1)
    return count


def tma_strides(t: torch.Tensor, batch_stride: int):
    """The strides a TMA descriptor takes for the (B, N, S, D) view ``t`` whose batch axis
    steps by ``batch_stride`` (0: packed, never stepped), or None where TMA cannot address
    it (a strided last dim, strides or base not 16-byte aligned)."""
    strides = [batch_stride, *t.stride()[1:]]
    if t.numel() == 0 or strides[-1] != 1 or t.data_ptr() % 16:
        return None
    if t.shape[0] == 1 or strides[0] == 0:  # never stepped: any aligned stride will do
        strides[0] = max(n * st for n, st in zip(t.shape[1:], strides[1:]))
        strides[0] += -strides[0] % 8
    if any(st * t.element_size() % 16 for st in strides[:-1]):
        return None
    return strides


def tma_capable(dev: torch.device) -> bool:
    """Tensor-memory-accelerator loads: Hopper and newer, or the interpreter."""
    if dev.type != "cuda":
        return interpreting()
    return device_capability(dev.index if dev.index is not None
                             else torch.cuda.current_device())[0] >= 9


def kv_tile_descriptor(t: torch.Tensor, batch_stride: int, rows: int, cols: int):
    """A TMA descriptor over the (B, N, S, D) view ``t`` loading (rows, cols) tiles, or None
    where TMA cannot address it (a strided last dim, strides or base not 16-byte aligned).
    Columns past D read as zero, as the masked loads do."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    strides = tma_strides(t, batch_stride)
    if strides is None:
        return None
    return TensorDescriptor(t, list(t.shape), strides, [1, 1, rows, cols])


def kv_tile_descriptors(binding: "Binding", k: torch.Tensor, k_batch_stride: int,
                        v: torch.Tensor, v_batch_stride: int, rows: int, cols: int,
                        cols_v: int) -> Optional[tuple]:
    """(K's, V's) TMA descriptors of (rows, cols) and (rows, cols_v) tiles
    (:func:`kv_tile_descriptor`), made through ``binding``; None where the device has no
    TMA (:func:`tma_capable`) or either view is not TMA-addressable."""
    if not tma_capable(k.device):
        return None
    k_desc = binding.descriptor(k, kv_tile_descriptor, batch_stride=k_batch_stride, rows=rows,
                                cols=cols)
    v_desc = binding.descriptor(v, kv_tile_descriptor, batch_stride=v_batch_stride, rows=rows,
                                cols=cols_v)
    return None if k_desc is None or v_desc is None else (k_desc, v_desc)


@functools.lru_cache(maxsize=None)
def device_capability(device_index: int) -> tuple[int, int]:
    """CUDA device ``device_index``'s compute capability (a driver query, cached)."""
    return torch.cuda.get_device_capability(device_index)


# --------------------------------------------------------------------------- launches

try:  # the launch internals :func:`launch` reuses (Triton 3.5 and later)
    from triton import knobs
    from triton.runtime import driver
except ImportError:
    knobs = driver = None

#: launch key -> (compiled kernel, the kernel's parameter names after the positional ones)
_LAUNCHES: dict = {}
#: launches that skipped Triton's argument binding (tests read it)
FAST_LAUNCHES = [0]
#: False: every launch through ``kernel[grid]`` (``ablate --host-time`` compares the two)
DIRECT_LAUNCH = True


def _spec(x):
    """What of a launch argument can change the compiled kernel Triton picks: a tensor's
    dtype and 16-byte alignment, an int's or a constexpr's value (stricter than Triton,
    which only looks at ==1, divisibility by 16 and the int width), a float's type, a
    descriptor's dtype, shape, strides, block and layout."""
    if type(x) is int:  # most arguments: strides, lengths, counts
        return x
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if type(x) is float:
        return float
    if type(x) is bool:
        return bool, x
    if hasattr(x, "block_shape"):  # a TMA TensorDescriptor (its base is 16-byte aligned)
        return (x.base.dtype, tuple(x.shape), tuple(x.strides), tuple(x.block_shape),
                getattr(x, "layout", None), getattr(x, "padding", None))
    return x


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, with Triton's per-call argument binding skipped
    when a call with the same :func:`_spec` of every argument ran before: that binding
    and the compiled-kernel lookup cost tens of microseconds of host time per launch, as
    much as a decode kernel's GPU time. The compiled kernel and its launcher
    are Triton's; only the lookup is ours. A call whose arguments Triton binds otherwise
    than we would (defaults, a Triton without these internals) always goes through
    ``kernel[grid]``, as does the interpreter."""
    _launch(kernel, grid, args, kwargs)


def _launch(kernel, grid: tuple, args: tuple, kwargs: dict):
    """:func:`launch`; returns (compiled kernel, the parameter names after the positional
    ones) where the launch can be repeated directly, else None."""
    if (not DIRECT_LAUNCH or knobs is None or INTERPRET.value
            or getattr(kernel, "pre_run_hooks", True)):
        kernel[grid](*args, **kwargs)
        return None
    device = driver.active.get_current_device()
    try:
        key = (kernel, device, knobs.runtime.debug, knobs.compilation.instrumentation_mode,
               *map(_spec, args), *[(name, _spec(value)) for name, value in kwargs.items()])
        hit = _LAUNCHES.get(key)
    except TypeError:  # an unhashable argument: no key
        key = hit = None
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        if key is not None:
            _remember(key, kernel, compiled, device, args, kwargs)
            return _LAUNCHES.get(key)
        return None
    compiled, names = hit
    _run_compiled(compiled, grid, (*args, *[kwargs[name] for name in names]), device)
    FAST_LAUNCHES[0] += 1
    return hit


def _run_compiled(compiled, grid: tuple, values: tuple, device) -> None:
    """Triton's launcher of ``compiled`` on the current stream, ``values`` in the kernel's
    parameter order."""
    stream = driver.active.get_current_stream(device)
    grid = (*grid, 1, 1)
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid[:3], stream, *values),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)


class PreparedLaunch:
    """A launch bound once: Triton's compiled kernel, the grid, the stream and every argument
    value in the kernel's parameter order, with the call's own tensors and workspaces
    (``roles``) at known positions. :meth:`run` launches the same compiled kernel on another
    call's objects of the same roles (:class:`PreparedCall` checks their layout first). No
    argument binding, key or lookup; where it can (:func:`_direct_send`), straight into
    Triton's C launcher."""

    __slots__ = ("name", "send", "values", "slots", "addresses", "keep", "described", "direct",
                 "compiled", "grid", "device")

    def __init__(self, name: str, send, values, slots, addresses=(), keep=(), described=(),
                 direct=False, compiled=None, grid=(), device=None):
        self.name, self.send, self.values, self.slots = name, send, values, slots
        self.addresses, self.keep = addresses, keep
        self.described, self.direct = described, direct
        self.compiled, self.grid, self.device = compiled, grid, device

    @classmethod
    def launch(cls, kernel, grid: tuple, args: tuple, kwargs: dict, roles: dict,
               described: Optional[dict] = None) -> Optional["PreparedLaunch"]:
        """:func:`launch` ``kernel`` on ``args``/``kwargs``; returns the launch bound for
        repeats on the current stream, or None where it cannot be (the interpreter, a
        Triton without the internals :func:`launch` reuses). ``described``: the TMA
        descriptors over a role's tensor (by id: the role and the descriptor's template
        first, :meth:`Binding.descriptor`), made again on a repeat only for a new address."""
        hit = _launch(kernel, grid, args, kwargs)
        if hit is None:
            return None
        compiled, names = hit
        values = [*args, *[kwargs[name] for name in names]]
        by_id = _first_roles(roles)
        slots = tuple((i, by_id[id(x)]) for i, x in enumerate(values) if id(x) in by_id)
        described = described or {}
        lazy = tuple((i, *described[id(x)][:2]) for i, x in enumerate(values)
                     if id(x) in described)
        for i in (*(i for i, _ in slots), *(i for i, _, _ in lazy)):
            values[i] = None  # keep no reference to this call's tensors
        device = driver.active.get_current_device()
        name = getattr(compiled, "name", str(compiled))
        direct = _direct_send(compiled, grid, device)
        if direct is None:
            return cls(name, functools.partial(_run_compiled, compiled, grid, device=device),
                       values, slots, described=lazy)
        send, pointers = direct
        # pointer parameters go to the C launcher as addresses: the plan's tensors once here
        # (kept alive), the call's own on each run; Triton would ask each tensor for its
        # address and the driver to check it, on every launch
        keep = []
        for i in pointers:
            if isinstance(values[i], torch.Tensor):
                keep.append(values[i])
                values[i] = values[i].data_ptr()
        addresses = tuple((i, role) for i, role in slots if i in pointers)
        slots = tuple((i, role) for i, role in slots if i not in pointers)
        return cls(name, send, values, slots, addresses, tuple(keep), lazy, True, compiled,
                   grid, device)

    def send_on_current_stream(self):
        """A direct send of this launch bound to the current stream (a graph's capture
        stream), or None where this launch has none."""
        if not self.direct:
            return None
        direct = _direct_send(self.compiled, self.grid, self.device)
        return None if direct is None else direct[0]

    def bound(self, roles: dict) -> list:
        """The argument values of a launch on ``roles`` (role -> tensor or descriptor), as
        :attr:`send` takes them."""
        values = self.values.copy()
        for i, role in self.slots:
            values[i] = roles[role]
        for i, role in self.addresses:
            values[i] = roles[role].data_ptr()
        for i, role, template in self.described:
            # the direct send makes the descriptor only for an address it has not filled
            values[i] = ((roles[role], template) if self.direct
                         else rebase(template, roles[role]))
        return values

    def run(self, roles: dict, send=None) -> None:
        """Launch on ``roles`` (role -> tensor or descriptor), through ``send`` where given
        (:meth:`send_on_current_stream`), else on the recording's stream."""
        values = self.bound(roles)
        if send is None:
            self.send(values)
            FAST_LAUNCHES[0] += 1
        else:  # into a graph's capture: launched when the graph is
            send(values)


def _direct_send(compiled, grid: tuple, device):
    """(send, the positions of its pointer parameters): ``send`` launches ``compiled`` on a
    list of argument values (addresses for the pointers, or tensors) by calling
    Triton's C launcher itself, with the launch's fixed head (grid, the current stream,
    the function, its metadata) built once, and each TMA descriptor's CUtensorMap filled
    once per base address (Triton fills one per descriptor on every launch; the map
    depends on nothing else, the descriptor's geometry being the recorded call's). None
    where this Triton's launcher is not the one read here, the kernel needs a scratch
    allocation, or launch hooks are set; each launch still goes through Triton's own
    path while hooks are set."""
    try:
        from triton.backends.nvidia import driver as nvidia

        run = compiled.run
        if (type(run) is not nvidia.CudaLauncher or run.global_scratch_size
                or run.profile_scratch_size or _hooked()):
            return None
        c_launch = run.launch
        kinds = list(compiled.src.signature.values())
        described = [i for i, kind in enumerate(kinds)
                     if isinstance(kind, str) and kind.startswith("tensordesc")]
        metas = list(getattr(compiled.metadata, "tensordesc_meta", None)
                     or [None] * len(described))
        if described:  # Triton wraps its C launcher to expand descriptors: unwrap it
            cells = dict(zip(c_launch.__code__.co_freevars,
                             (c.cell_contents for c in c_launch.__closure__)))
            c_launch = cells["launcher"]
        if len(metas) != len(described) or not callable(c_launch):
            return None
        expand = nvidia.make_tensordesc_arg
        pointers = frozenset(i for i, kind in enumerate(kinds)
                             if isinstance(kind, str) and kind.startswith("*"))
    except Exception:  # noqa: BLE001 - another Triton: its own launch path
        return None
    grid = (*grid, 1, 1)
    head = (grid[0], grid[1], grid[2], driver.active.get_current_stream(device),
            compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
            compiled.packed_metadata, None, None, None)
    send = DirectSend(compiled, grid[:3], device, head, c_launch, kinds, described, metas, expand)
    return send, pointers


class DirectSend:
    """A launch of ``compiled`` straight into Triton's C launcher (:func:`_direct_send`): the
    fixed head bound once, each TMA descriptor's CUtensorMap filled once per base address."""

    __slots__ = ("compiled", "grid", "device", "head", "c_launch", "kinds", "described",
                 "metas", "expand", "filled")

    def __init__(self, compiled, grid, device, head, c_launch, kinds, described, metas, expand):
        self.compiled, self.grid, self.device, self.head = compiled, grid, device, head
        self.c_launch, self.kinds, self.expand = c_launch, kinds, expand
        self.described, self.metas = described, metas
        self.filled: dict = {}

    def expanded(self, values: list) -> list:
        """``values`` (changed in place) as the C launcher takes them after its head: each
        descriptor expanded into its CUtensorMap (or base), shape and strides."""
        filled = self.filled
        for i, meta in zip(reversed(self.described), reversed(self.metas)):
            descriptor = values[i]
            if meta is None:
                values[i:i + 1] = self.expand(_descriptor(descriptor), None)
                continue
            base = descriptor[0] if type(descriptor) is tuple else descriptor.base
            key = (i, base.data_ptr())
            parts = filled.get(key)
            if parts is None:
                if len(filled) > 64:
                    filled.clear()
                parts = filled[key] = self.expand(_descriptor(descriptor), meta)
            values[i:i + 1] = parts
        return values

    @staticmethod
    def map_width(value) -> int:
        """How many values a descriptor argument lowered to a CUtensorMap expands to: the
        map, then its shape and strides."""
        return 1 + 2 * len(_descriptor(value).shape)

    def __call__(self, values: list) -> None:
        if _hooked():
            for i in self.described:
                values[i] = _descriptor(values[i])
            _run_compiled(self.compiled, self.grid, values, self.device)
            return
        self.c_launch(*self.head, *self.expanded(values))


def _descriptor(value):
    """A descriptor argument as :meth:`PreparedLaunch.run` passes it: the descriptor, or
    (the call's tensor, the template to copy over it)."""
    return rebase(value[1], value[0]) if type(value) is tuple else value


def _hooked() -> bool:
    """Whether a launch hook is set (Triton's default is an empty chain of hooks, which
    still costs it a metadata dictionary per launch)."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


class Binding:
    """Every launch and workspace of one call, in order, recorded while the call runs them
    (the first call of a plan) so that the plan's later calls repeat them on their own
    tensors (:meth:`prepared`). ``roles``: the call's own tensors by role; None records
    nothing and only launches. Workspaces, and what is made from a role's tensor (a
    view, a TMA descriptor, a gather), are made through :meth:`empty` and :meth:`derive`,
    which record how to make them again, in their place among the launches. A recording
    keeps its workspaces for its repeats, within :data:`KEPT_WORKSPACE_BYTES` per device
    (:func:`kept_workspace`)."""

    def __init__(self, roles: Optional[dict]):
        self.roles = roles
        self.layout = _role_layout(roles) if roles is not None else None
        self.names = tuple(roles) if roles is not None else None  # the call's roles, in order
        self.actions: list = []  # in call order: steps (callables on roles), launches
        self.complete = roles is not None
        self.kept: set = set()  # ids of the workspaces the recording keeps
        # id of a descriptor over a role -> (role, template, the descriptor: kept alive,
        # so that its id names no later object)
        self.described: dict = {}
        self.counters_taken = 0  # counters this call took from a capture's arena

    def empty(self, name: str, shape, dtype, device, fill=None) -> torch.Tensor:
        """A new tensor of ``shape`` (filled with ``fill`` unless None), role ``name``;
        where the call is recorded and ``fill`` is None, one the recording keeps and its
        repeats reuse, where the budget allows."""
        shape = tuple(shape)
        if self.roles is None:
            return _make_workspace(name, shape, dtype, device, fill, {})
        kept = kept_workspace(shape, dtype, device) if fill is None else None
        if kept is not None:
            self.kept.add(id(kept))
            return self._record(name, functools.partial(_reuse_workspace, name, kept))
        return self._record(name, functools.partial(_make_workspace, name, shape, dtype,
                                                    device, fill))

    def zeroed(self, shape, dtype, device) -> torch.Tensor:
        """A zero-filled buffer that the call's kernels leave zeroed when they finish
        (counters each resets after its last use): not a role, so a recorded call keeps
        it and its repeats launch no fill. int32 counters of a call under CUDA graph
        capture come from :mod:`~pasa_npu.fallback.capture_counters` where it holds
        them, so that the graph holds no fill for them either."""
        shape = tuple(shape)
        device = torch.device(device)
        if dtype == torch.int32 and device.type == "cuda" and keeps_device_tensors():
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            n = math.prod(shape)
            if not torch.cuda.is_current_stream_capturing():
                capture_counters.top_up(device, n)
            else:
                self.counters_taken += n
                arena = capture_counters.arena(device, self.counters_taken)
                if arena is not None:
                    return arena[self.counters_taken - n:self.counters_taken].view(shape)
        return torch.zeros(shape, dtype=dtype, device=device)

    def derive(self, name: str, source, make, *more, reads_contents: bool = True):
        """``make(source, *more)``; where one of those is a role's tensor, recorded as role
        ``name``, made again from each call's tensors of those roles (the others are the
        plan's, kept). ``reads_contents`` False (a view, a descriptor): ``make`` reads only
        where its sources lie, so a kept workspace counts as the plan's."""
        sources = (source, *more)
        if self.roles is None:
            return make(*sources)
        by_id = _first_roles(self.roles)
        refs = tuple((by_id[id(t)], None)
                     if id(t) in by_id and (reads_contents or id(t) not in self.kept)
                     else (None, t) for t in sources)
        if all(role is None for role, _ in refs):
            return make(*sources)
        return self._record(name, functools.partial(_derive, name, refs, make))

    def descriptor(self, t: torch.Tensor, make, **options):
        """A TMA descriptor over ``t`` (:func:`descriptor_template`; None where ``make``
        builds none). Where ``t`` is a role's tensor, a repeat's launch makes it anew,
        by copying the template over that call's tensor (its layout is the record's), and
        only for an address it has not met (:meth:`PreparedLaunch.run`)."""
        template = descriptor_template(t, make, **options)
        if template is None:
            return None
        made = rebase(template, t)
        role = _first_roles(self.roles).get(id(t)) if self.roles is not None else None
        if role is not None and id(t) not in self.kept:
            self.described[id(made)] = (role, template, made)
        return made

    def _record(self, name: str, step):
        if name in self.roles:
            raise ValueError(f"role {name!r} is recorded twice")
        made = step(self.roles)
        if made is None:  # nothing made (no descriptor for this layout): no role
            del self.roles[name]
        else:
            self.actions.append(step)
        return made

    def launch(self, kernel, grid: tuple, *args, **kwargs) -> None:
        """:func:`launch`, recorded."""
        if not self.complete:
            launch(kernel, grid, *args, **kwargs)
            return
        bound = PreparedLaunch.launch(kernel, grid, args, kwargs, self.roles, self.described)
        if bound is None:
            self.complete = False
        else:
            self.actions.append(bound)

    def prepared(self) -> Optional["PreparedCall"]:
        """The recorded call, or None where it cannot be repeated."""
        if not self.complete or not any(isinstance(a, PreparedLaunch) for a in self.actions):
            return None
        return PreparedCall(tuple(self.actions), self.layout, self.names)


def _env_mib(name: str, default: int) -> int:
    text = os.environ.get(name, str(default))
    try:
        mib = int(text)
    except ValueError:
        mib = -1
    if mib < 0:
        raise ValueError(f"{name} must be a whole number of MiB >= 0, got {text!r}")
    return mib


#: bytes of workspace (the splits' partial results, K' and its block means, the length
#: rows) that recorded calls keep from call to call, per device: a repeat then allocates
#: nothing. Past it a recording allocates its workspaces on every repeat, as an unrecorded
#: call does. ``PASA_NPU_KEPT_WORKSPACE_MIB`` sets it; the memory is returned when the
#: plans holding it go (``pasa_npu.plans.clear()``).
KEPT_WORKSPACE_BYTES = _env_mib("PASA_NPU_KEPT_WORKSPACE_MIB", 512) << 20
_KEPT_BYTES: dict = {}  # device -> bytes the recordings keep
_KEPT_LOCK = threading.Lock()


def kept_workspace(shape: tuple, dtype, device) -> Optional[torch.Tensor]:
    """A new tensor that a recording keeps, counted against :data:`KEPT_WORKSPACE_BYTES`
    until it is freed; None where the device's budget is spent."""
    nbytes = math.prod(shape) * dtype.itemsize
    device = torch.device(device)
    with _KEPT_LOCK:
        used = _KEPT_BYTES.get(device, 0)
        if used + nbytes > KEPT_WORKSPACE_BYTES:
            return None
        _KEPT_BYTES[device] = used + nbytes
    try:
        t = torch.empty(shape, dtype=dtype, device=device)
    except BaseException:  # out of memory, say: the bytes were never kept
        _release_kept(device, nbytes)
        raise
    weakref.finalize(t, _release_kept, device, nbytes)
    return t


def kept_workspace_bytes(device) -> int:
    """Bytes of workspace the recordings keep on ``device`` now."""
    return _KEPT_BYTES.get(torch.device(device), 0)


def _release_kept(device, nbytes: int) -> None:
    with _KEPT_LOCK:
        _KEPT_BYTES[device] -= nbytes


def _make_workspace(name, shape, dtype, device, fill, roles):
    made = roles[name] = (torch.empty(shape, dtype=dtype, device=device) if fill is None
                          else torch.full(shape, fill, dtype=dtype, device=device))
    return made


def _reuse_workspace(name, kept, roles):
    roles[name] = kept
    return kept


def _derive(name, refs, make, roles):
    made = roles[name] = make(*[roles[role] if role is not None else t for role, t in refs])
    return made


class PreparedCall:
    """A call's launches and workspaces, recorded (:class:`Binding`): :meth:`__call__`
    repeats them, in order, on another call's tensors, replaying a CUDA graph of the
    launches where it can (:data:`GRAPH_REPEATS`): one graph launch costs the host less
    than one kernel launch. The first repeat captures the graph; where its kernels' address
    arguments can be rewritten (:class:`~pasa_npu.fallback.graph_update.AddressedGraph`),
    every later repeat replays it on its own tensors' addresses. Otherwise a graph is
    captured per address set, at its second sight, and replayed only on those addresses.
    Every argument of the launches but the addresses of the call's tensors is the
    recording's, so that a graph computes what the launches would."""

    __slots__ = ("actions", "layout", "graphs", "kernels", "addressed", "owned", "computes",
                 "steps", "names", "strides")

    def __init__(self, actions: tuple, layout: tuple, names: tuple = ()):
        self.actions = actions
        self.layout = layout  # the strides and 16-byte alignment of the binding call's tensors
        # the binding call's roles, in order, and their strides where their tensors are
        # distinct and all 16-byte aligned (the layout a repeat checks in :meth:`_replay_at`)
        self.names = names
        self.strides = ([strides for strides, _ in layout] if names and len(layout) == len(names)
                        and all(aligned for _, aligned in layout) else None)
        launches = [a for a in actions if type(a) is PreparedLaunch]
        self.kernels = len(launches)
        # the call's tensors' (address, strides) -> the graph of the launches, or None
        # where seen once; None where the launches cannot be captured (a launch through
        # Triton's own path) or should not be (a large workspace made anew on every call:
        # each graph would keep one)
        self.graphs = ({} if GRAPH_REPEATS and all(a.direct for a in launches) and not any(
            _new_workspace_bytes(a) > GRAPH_WORKSPACE_BYTES for a in actions) else None)
        # the graph that takes any call's addresses: None until the first repeat tries to
        # make it, False where it cannot be made (graph_update says where)
        self.owned, self.computes = _graph_owned_roles(actions)
        # the steps an addressed graph's replay runs first: those it does not hold
        self.steps = tuple(a for a in actions if type(a) is not PreparedLaunch
                           and a.args[0] not in (self.owned or ()))
        self.addressed = (None if self.graphs is not None and self.owned is not None
                          and graph_update.supported() else False)

    def __call__(self, roles: dict) -> bool:
        """Repeat the call on ``roles`` (the call's own tensors); False, launching
        nothing, where a tensor's strides or alignment differ from the binding call's
        (workspaces, and what is derived from the tensors, then follow as they did)."""
        addressed = self.addressed
        if (addressed and addressed.columns is not None and self.strides is not None
                and not self.steps):
            replayed = self._replay_at(addressed, roles)
            if replayed is not None:
                return replayed
        # each tensor's address and strides: a call that matches a graph's has the layout
        # the graph was captured with, and the same memory in every role
        where = tuple([(t.data_ptr(), t.stride()) for t in roles.values()])
        graphs = self.graphs if GRAPH_REPEATS else None
        hooked = graphs is not None and _hooked()
        if graphs is not None and not hooked and not self.addressed:
            graph = graphs.get(where)
            if graph is not None:
                with _REPEAT_LOCK:
                    return self._replay(graph)
        if _role_layout(roles, where) != self.layout:
            return False
        # one repeat at a time: a recording's kept workspaces serve one call, so two
        # threads on one stream must not interleave their launches
        with _REPEAT_LOCK:
            if graphs is None or hooked:
                self._run(roles)
                return True
            if self.addressed is None:
                graph = self._capture(roles, keep_graph=True)
                self.addressed = (graph_update.AddressedGraph.make(
                    graph, [a for a in self.actions if type(a) is PreparedLaunch], roles,
                    self.names, self.owned, self.computes) if graph is not None else None) or False
                if self.addressed:
                    return self._replay(graph)
                if graph is not None:  # captured, not addressable: this address set's graph
                    graphs[where] = graph
                    return self._replay(graph)
            if self.addressed:
                for step in self.steps:  # what is made from the call's own tensors
                    step(roles)
                return self._replay_addressed(self.addressed.addresses_of(roles), roles)
            graph = self._capture(roles) if where in graphs else None  # seen once before
            if graph is None:
                if len(graphs) >= GRAPHS_PER_CALL:
                    graphs.clear()
                graphs[where] = None
                self._run(roles)
                return True
            graphs[where] = graph
            return self._replay(graph)

    def _replay_at(self, addressed, roles: dict) -> Optional[bool]:
        """:meth:`__call__` where the addressed graph takes every address from the call's own
        tensors (no step derives one) and the binding call's were distinct and aligned: the
        layout checked against those strides and that alignment, the graph replayed on the
        call's addresses. None, having launched nothing, where this call needs the general
        path (other roles, tensors that may share one, a launch hook, graphs switched off)."""
        tensors = roles.values()
        pointers = [t.data_ptr() for t in tensors]
        if (tuple(roles) != self.names or not GRAPH_REPEATS or _hooked()
                or len(set(pointers)) != len(pointers)):
            return None
        if ([t.stride() for t in tensors] != self.strides
                or functools.reduce(operator.or_, pointers) & 15):
            return False
        addresses = [pointers[i] for i in addressed.columns]
        with _REPEAT_LOCK:
            if self.addressed is not addressed:
                return None
            return self._replay_addressed(addresses, roles)

    def _replay_addressed(self, addresses: list, roles: dict) -> bool:
        """Replay the addressed graph on ``addresses`` (those of ``roles``; the caller holds
        _REPEAT_LOCK) and count it; where the driver refuses a node's arguments, launch
        ``roles`` instead, and never replay it again."""
        try:
            self.addressed.replay(addresses)
        except RuntimeError:
            self.addressed = False
            self._run(roles)
            return True
        GRAPH_REPLAYS[0] += 1
        GRAPH_KERNELS[0] += self.kernels
        return True

    def _replay(self, graph) -> bool:
        """Replay ``graph`` (the caller holds _REPEAT_LOCK) and count it."""
        graph.replay()
        GRAPH_REPLAYS[0] += 1
        GRAPH_KERNELS[0] += self.kernels
        return True

    def _run(self, roles: dict, sends: Optional[dict] = None) -> None:
        for action in self.actions:
            if type(action) is not PreparedLaunch:
                action(roles)
            elif sends is None:
                action.run(roles)
            else:
                action.run(roles, sends[id(action)])

    def _capture(self, roles: dict, keep_graph: bool = False):
        """A CUDA graph of the launches on ``roles``, captured on a side stream of their
        device (``keep_graph``: its cudaGraph_t kept, for :mod:`graph_update`, and the graph
        instantiated); None (and no graph for this call again) where the capture or the
        instantiation fails."""
        device = next(iter(roles.values())).device
        try:
            graph = torch.cuda.CUDAGraph(keep_graph=keep_graph) if keep_graph else torch.cuda.CUDAGraph()
            with torch.cuda.device(device), torch.cuda.stream(_capture_stream(device)):
                sends = {id(a): a.send_on_current_stream() for a in self.actions
                         if type(a) is PreparedLaunch}
                if None in sends.values():
                    raise RuntimeError("a launch without a direct send")
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    self._run(roles, sends)
                finally:
                    graph.capture_end()
                if keep_graph:
                    graph.instantiate()
        except Exception:  # noqa: BLE001 - repeat without graphs, as before
            self.graphs = None
            self.addressed = False
            return None
        return graph


def _graph_owned_roles(actions: tuple) -> tuple:
    """(the roles a graph of ``actions`` holds itself, whether it computes any of them): the
    workspaces, made on each call (in the graph's memory) or kept, and what is derived from
    those alone, which the graph computes in its place among the launches. They stay where
    the capture found them, and no step makes them again. (None, False) where a step
    derives from both such a role and the call's own tensors: the graph could not
    compute it, and made before the graph it would precede the launches it follows."""
    owned, computes = set(), False
    for action in actions:
        if not isinstance(action, functools.partial):
            continue
        name = action.args[0]
        if action.func is _make_workspace:
            owned.add(name)
            computes = computes or action.args[4] is not None
        elif action.func is _reuse_workspace:
            owned.add(name)
        elif action.func is _derive:
            sources = {role for role, _ in action.args[1] if role is not None}
            if sources <= owned:
                owned.add(name)
                computes = True
            elif sources & owned:
                return None, False
    return frozenset(owned), computes


#: whether recorded calls replay CUDA graphs on repeated addresses (:class:`PreparedCall`);
#: ``PASA_NPU_GRAPH_REPEATS=0`` launches every kernel of every repeat (read at each call;
#: a record made while it is off never makes graphs)
GRAPH_REPEATS = os.environ.get("PASA_NPU_GRAPH_REPEATS", "1") != "0"
#: address sets a recorded call remembers (seen once, or with a graph) before it forgets all
GRAPHS_PER_CALL = 32
#: repeats that replayed a graph, and the kernels those graphs ran (tests and ``pasa-bench``
#: read them)
GRAPH_REPLAYS = [0]
GRAPH_KERNELS = [0]


#: bytes of a workspace made on every call (a filled one) that a graph may keep
GRAPH_WORKSPACE_BYTES = 1 << 20


def _new_workspace_bytes(action) -> int:
    """Bytes of the workspace ``action`` makes anew on each call; 0 for any other action."""
    if not (isinstance(action, functools.partial) and action.func is _make_workspace):
        return 0
    _, shape, dtype, *_ = action.args
    return math.prod(shape) * dtype.itemsize


@functools.lru_cache(maxsize=None)
def _capture_stream(device):
    return torch.cuda.Stream(device)


_REPEAT_LOCK = threading.Lock()


def _first_roles(roles: dict) -> dict:
    """id of each role's tensor -> the first role that holds it (:func:`_role_layout`)."""
    by_id: dict = {}
    for role, t in roles.items():
        by_id.setdefault(id(t), role)
    return by_id


def _role_layout(roles: dict, where: Optional[tuple] = None) -> tuple:
    """The strides and 16-byte alignment of each role's tensor (``where``: their
    ``(data_ptr(), stride())`` pairs, where known), and, where roles share one tensor (a
    key that is the value), which: a recorded launch fills a shared tensor's positions
    from its first role, so it repeats only on calls that share the same way."""
    tensors = roles.values()
    if where is None:
        where = [(t.data_ptr(), t.stride()) for t in tensors]
    layout = tuple([(strides, address % 16 == 0) for address, strides in where])
    ids = [id(t) for t in tensors]
    if len(set(ids)) == len(ids):
        return layout
    return (*layout, tuple(ids.index(i) for i in ids))


def descriptor_template(t: torch.Tensor, make, **options):
    """``make(t, **options)``, a TMA descriptor for ``t`` without its base (or None), built
    once per ``make``, ``options`` and dtype, shape, strides and alignment of ``t`` (the
    constructors' checks cost host time on every call), to copy over each tensor of that
    layout (:func:`rebase`)."""
    key = (make, t.dtype, tuple(t.shape), t.stride(), t.data_ptr() % 16 == 0,
           *options.items())
    template = _DESCRIPTORS.get(key, _DESCRIPTORS)
    if template is _DESCRIPTORS:
        if len(_DESCRIPTORS) > 256:
            _DESCRIPTORS.clear()
        template = make(t, **options)
        template = _DESCRIPTORS[key] = None if template is None else rebase(template, None)
    return template


_DESCRIPTORS: dict = {}


def rebase(descriptor, base):
    """A copy of the TMA descriptor ``descriptor`` over ``base``, a tensor of its base's
    dtype, shape, strides and 16-byte alignment (so that the checks its constructor made
    hold, and are not made again)."""
    twin = object.__new__(type(descriptor))
    twin.__dict__.update(descriptor.__dict__)
    twin.base = base
    return twin


def _remember(key, kernel, compiled, device, args, kwargs) -> None:
    """Keep ``compiled`` for ``key`` if launching it directly passes the arguments exactly as
    Triton's own binding does (the same objects, in order); otherwise never."""
    try:
        names = kernel.arg_names[len(args):]
        values = [*args, *[kwargs[name] for name in names]]  # KeyError: a default is used
        binder = kernel.device_caches[device][-1]
        bound = list(binder(*args, **kwargs)[0].values())
        compiled.packed_metadata, compiled.launch_metadata  # noqa: B018
    except Exception:  # noqa: BLE001 - another Triton: keep its own launch path
        return
    if len(bound) != len(values) or any(a is not b for a, b in zip(bound, values)):
        return
    if len(_LAUNCHES) > 256:
        _LAUNCHES.clear()
    _LAUNCHES[key] = (compiled, names)
