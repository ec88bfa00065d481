"""What the AscendC kernels of ``ascend_kernels/`` compute, and a problem's tensors in the
form they read them, for the backends that run those kernels: ``ascendc-emu`` (the CPU
emulation), ``ascendc-sim`` (the CPU simulator) and ``npu`` (an Ascend NPU through torch_npu).

The kernels implement ``fa-fp32``, ``pasa`` and ``pasa-exact`` for BNSD and BSND (BSH)
tensors and packed batches (TND/NTD: mixed decode and prefill rows, kv lengths past the
query lengths), paged K/V caches read through the block table (either cache shape, blocks
of 16 to 512 rows), GQA, explicit bool/int8 masks and the band of sparse modes 0-4 (pre/next tokens),
ragged lengths, learnable sinks, fp16 compute (bf16 inputs of the PASA allocations are converted
by the API layer; the output may be bf16) and head dims that are multiples of 16; other head
dims reach them zero-padded to the next multiple (:func:`kernel_call`), but for paged caches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .paged_kv import to_device
from .problem import AttentionProblem

#: the allocations the kernels implement, each with its tiling key (the attention kernel's
#: C++ dispatch)
TILING_KEYS = {"fa-fp32": 0, "pasa": 1, "pasa-exact": 2}
#: memory orders of a (B, N, S, D) view the kernels read and write (PASA_LAYOUT_*)
BNSD, BSND = 0, 1
#: the band (PASA_MASK_*): none, j <= i + next, i - pre <= j <= i + next
MASK_NONE, MASK_CAUSAL, MASK_BAND = 0, 1, 2
_INT32 = (-(2 ** 31), 2 ** 31 - 1)


def unsupported_reason(problem: AttentionProblem, backend: str) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified, else the feature they
    lack, in a sentence naming ``backend``."""
    alloc = problem.allocation.name
    if alloc not in TILING_KEYS:
        return (f"the {backend} kernels implement algorithm in {sorted(TILING_KEYS)}, "
                f"not {alloc!r}")
    if problem.paged and (problem.block_size % 16 or not 16 <= problem.block_size <= 512):
        return (f"paged KV needs block_size a multiple of 16 in [16, 512] in the {backend} "
                f"kernels, got {problem.block_size}")
    if problem.mask is not None and problem.tiling.kv_block < 32:
        return (f"an explicit atten_mask needs kv_block >= 32 in the {backend} kernels (a block's "
                f"mask row fills 32 bytes), got {problem.tiling.kv_block}")
    if problem.rounding_guard:
        return f"rounding_guard=True is not supported by the {backend} kernels"
    in_dtype, out_dtype = problem.query.dtype, problem.out.dtype
    if in_dtype not in (torch.float16, torch.bfloat16) or out_dtype not in (torch.float16, torch.bfloat16):
        return f"dtypes {in_dtype} -> {out_dtype} are not supported by the {backend} kernels"
    if in_dtype == torch.bfloat16 and (problem.allocation.shifts_keys
                                       or out_dtype != torch.bfloat16):
        return (f"bf16 inputs are supported for fa-fp32 with a bf16 output only (out_dtype None "
                f"or torch.bfloat16), not for {alloc!r} with a "
                f"{str(out_dtype).replace('torch.', '')} output")
    d, d_v = problem.query.shape[3], problem.value.shape[3]
    if problem.paged and (d % 16 or d_v % 16):
        return (f"paged KV needs head dims that are multiples of 16 in the {backend} kernels (other "
                f"head dims are zero-padded, which would copy the whole cache; got D={d}, Dv={d_v})")
    return None


def layout_of(t: torch.Tensor) -> Optional[int]:
    """BNSD if the (B, N, S, D) view is a contiguous BNSD tensor, BSND if contiguous BSND,
    else None."""
    if t.is_contiguous():
        return BNSD
    if t.permute(0, 2, 1, 3).is_contiguous():
        return BSND
    return None


def in_layout(t: torch.Tensor, layout: int) -> torch.Tensor:
    """The (B, N, S, D) view ``t`` backed by a tensor contiguous in ``layout`` (a copy when
    it is not already)."""
    if layout == BNSD:
        return t.contiguous()
    return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


@dataclass(frozen=True)
class KernelCall:
    """One call of the kernels. Tensors are (B, N, S, D) views, each contiguous in the
    memory order its layout names; key and value share one. ``out`` is the problem's
    output when it already is such a view, else a BNSD temporary that :meth:`finish` copies
    back; ``lse`` likewise (float32, (B, Nq, Sq)), None when the problem wants no LSE."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    out: torch.Tensor
    lse: Optional[torch.Tensor]
    q_layout: int
    kv_layout: int
    out_layout: int
    tiling_key: int
    mask_mode: int
    lengths: dict  # name -> int32 CPU tensor of B entries (BatchLengths of pasa_tiling.h)
    mask: Optional[torch.Tensor]  # uint8 (B|1, S1, S2), last dim contiguous, nonzero = masked
    block_table: Optional[torch.Tensor]  # paged: int32 (B, max_blocks), contiguous
    key_slots: Optional[torch.Tensor]  # paged PASA: int32 (B, max_blocks), see key_slots()
    sink: Optional[torch.Tensor] = None  # learnable sinks: float32 (Nq,), contiguous

    def finish(self, problem: AttentionProblem) -> None:
        """Copy the temporaries (if any) into the problem's output views."""
        if self.out is not problem.out:
            problem.out.copy_(self.out[..., :problem.out.shape[3]])
        if problem.lse is not None and self.lse is not problem.lse:
            problem.lse.copy_(self.lse)


def kernel_call(problem: AttentionProblem) -> KernelCall:
    """``problem`` (which the kernels support) as the kernels read it: inputs copied only
    where their memory order is neither BNSD nor BSND, V copied to K's layout if it differs.
    Head dims that are not multiples of 16 (the cube's fractal) are zero-padded to the next
    one, in BNSD copies: a zero column adds exact zeros to every score and to K's block means,
    and the output's extra columns are dropped by :meth:`KernelCall.finish`."""
    q, k, v = problem.query, problem.key, problem.value
    q_layout, kv_layout, out_layout = layout_of(q), layout_of(k), layout_of(problem.out)
    out = problem.out
    if q.shape[3] % 16 or v.shape[3] % 16:
        q, k, v = (_padded16(t) for t in (q, k, v))
        q_layout = kv_layout = BNSD
        if out.shape[3] % 16:  # from the output's values: rows the kernels skip keep them
            out, out_layout = _padded16(out), BNSD
    if q_layout is None:
        q, q_layout = q.contiguous(), BNSD
    if kv_layout is None:
        k, kv_layout = k.contiguous(), BNSD
    if layout_of(v) != kv_layout:  # the kernel reads K and V in one layout
        v = in_layout(v, kv_layout)
    if out_layout is None:
        out, out_layout = out.contiguous(), BNSD  # a copy: rows the kernels skip keep their value
    lse = problem.lse
    if lse is not None and not lse.is_contiguous():
        lse = lse.contiguous()
    mask_mode, lengths = band_lengths(problem)
    table = slots = None
    if problem.paged:
        table = problem.block_table.to(torch.int32).contiguous()
        if problem.allocation.shifts_keys:  # fa-fp32 reads no K'
            slots = key_slots(table, problem.kv_lens, problem.block_size,
                              problem.tiling.kv_block, problem.key.shape[0])
    return KernelCall(query=q, key=k, value=v, out=out, lse=lse, q_layout=q_layout,
                      kv_layout=kv_layout, out_layout=out_layout,
                      tiling_key=TILING_KEYS[problem.allocation.name],
                      mask_mode=mask_mode, lengths=lengths, mask=mask_bytes(problem.mask),
                      block_table=table, key_slots=slots,
                      sink=None if problem.sink is None else problem.sink.to(torch.float32).contiguous())


def _padded16(t: torch.Tensor) -> torch.Tensor:
    """The (B, N, S, D) view ``t`` with zero columns up to the next multiple of 16 of D, a
    BNSD-contiguous copy."""
    return torch.nn.functional.pad(t, (0, -t.shape[3] % 16))


def key_slots(table: torch.Tensor, kv_lens: torch.Tensor, block_size: int, kv_block: int,
              num_blocks: int) -> torch.Tensor:
    """Paged KV: for each table entry, the entry (flat index b * max_blocks + e) that owns its
    physical block, whose preprocessing writes the block's K' (and pasa-exact's block means)
    once for every sequence sharing it: of the entries naming the block, the one whose
    sequence fills the most whole kv blocks of it (the first on a tie). Each sequence's ragged
    last kv block is preprocessed into its own entry (the kernels' KvPages::KeySlot); entries
    past a sequence's blocks own themselves. ``table`` int32 (B, max_blocks) on its device,
    whose used entries lie in [0, num_blocks); ``kv_lens`` on the host. Computed where the
    table is, without reading it back: each entry's rank comes from the lengths, and each
    physical block keeps its best-ranked entry."""
    batch, width = table.shape
    count = batch * width
    entries = torch.arange(count, dtype=torch.int64).view(batch, width)
    first = torch.arange(width, dtype=torch.int64)[None, :] * block_size
    lens = kv_lens.to(torch.int64)[:, None]
    whole = (lens - first).clamp(0, block_size) // kv_block
    # more whole kv blocks first, then the lower entry; -1: not a used entry
    rank = to_device(torch.where(first < lens, whole * count + (count - 1 - entries), -1),
                     table.device)
    used = rank >= 0
    blocks = torch.where(used, table.to(torch.int64), num_blocks)  # unused: a spare bucket
    best = torch.full((num_blocks + 1,), -1, dtype=torch.int64, device=table.device)
    best.scatter_reduce_(0, blocks.flatten(), rank.flatten(), "amax")
    owner = (count - 1 - best % count)[blocks]
    own = entries.to(table.device)
    return torch.where(used, owner, own).to(torch.int32)


def band_lengths(problem: AttentionProblem) -> tuple[int, dict]:
    """(PASA_MASK_* of the band, the per-batch int32 arrays the host launcher reads): the
    band's bounds clamped to int32 (positions fit int32, so the clamp changes no visibility);
    a lower bound no row reaches (pre >= q_len - 1) leaves the causal mode."""
    i32 = lambda t: t.to(torch.int64).clamp(*_INT32).to(torch.int32).cpu().contiguous()  # noqa: E731
    lengths = dict(q_lens=i32(problem.q_lens), kv_lens=i32(problem.kv_lens))
    mode = MASK_NONE
    if problem.band is not None:
        pre, nxt = problem.band
        mode = MASK_BAND if bool((pre < problem.q_lens - 1).any()) else MASK_CAUSAL
        lengths.update(next_tokens=i32(nxt), pre_tokens=i32(pre))
    if problem.packed:
        lengths.update(q_starts=i32(problem.q_starts), kv_starts=i32(problem.kv_starts))
    return mode, lengths


def mask_bytes(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The bool (B|1, S1, S2) mask as uint8 bytes with a contiguous last dim (a view when it
    already is one)."""
    if mask is None:
        return None
    if mask.stride(-1) != 1:
        mask = mask.contiguous()
    return mask.view(torch.uint8)
