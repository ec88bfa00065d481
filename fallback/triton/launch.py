"""Launch heuristics of the Triton kernels: tile sizes, warps and pipeline stages, the
kv-block loops a prefill problem can enter, pasa-exact's row-constant form, the decode
kernel's rows per program and kv splits. Each choice was measured fastest on an H100
(``pasa-bench``, ``tools/dev/ablate.py``); ``tools/dev/triton_aot.py`` checks the resources a
choice assumes against the compiled kernels."""
from __future__ import annotations

from pasa_npu.fallback.kernel_common import cdiv, pow2
from pasa_npu.fallback.triton.metadata import host_ints
from pasa_npu.fallback.triton.tuning import Tuning
from pasa_npu.numerics import Allocation
from pasa_npu.problem import AttentionProblem

# keys per step of decode's overflow repair in its merging program: few, so that the
# repair adds little to the decode kernel's registers (tools/dev/triton_aot.py compiles it)
DECODE_REPAIR_KEYS = 16
#: the same under the interpreter, where a step's width costs no registers and each step
#: costs interpreted operations
INTERPRETED_REPAIR_KEYS = 128
GRID_AXIS_MAX = 65535  # CUDA's limit on a grid's second and third axes


def launch_config(head_dim: int, algorithm: str, interpret: bool, extra_operand: bool = False,
                  loops: int = 7, masked: bool = False) -> tuple[int, int, int]:
    """(BLOCK_M, num_warps, num_stages) for the prefill kernel, as measured fastest on an
    H100 for each allocation. ``extra_operand``: the kernel stages one more matmul operand
    in shared memory (pasa-exact's in-kernel row constant, a fused key shift). ``loops``:
    the kv-block loops compiled in (:func:`block_loops`). ``masked``: an explicit mask,
    whose tile is staged with K and V."""
    if interpret:  # the interpreter's cost is per operation and program: fewer, larger tiles
        return 64, 1, 1
    if head_dim > 128:  # 128 x 256 fp16 K and V tiles: one stage fits shared memory
        return 64, 8, 1
    if head_dim == 128 and (extra_operand or masked):
        # the extra operand, or the 128 x 128 mask tile (three stages of K, V and mask
        # need 241 KiB, over the H100's 227), leaves no room for a third stage
        return 128, 8, 2
    if head_dim <= 64 and algorithm in ("pasa", "pasa-exact"):
        # where only the interior loop runs, 128-row tiles in two stages; with the masked
        # loops compiled in (causal), 64-row tiles in three, except with pasa-exact's row
        # constant in the loop
        if loops == 2 or extra_operand:
            return 128, 4, 2
        return 64, 4, 3
    if head_dim <= 64 and algorithm == "pasa-mixed":
        return (64, 4, 2) if loops == 2 else (64, 4, 3)
    return 128, 8, 3


def decode_repair_keys(interpret: bool) -> int:
    """Keys per step of decode's overflow repair (:data:`DECODE_REPAIR_KEYS`,
    :data:`INTERPRETED_REPAIR_KEYS`)."""
    return INTERPRETED_REPAIR_KEYS if interpret else DECODE_REPAIR_KEYS


def block_loops(problem: AttentionProblem, block_n: int) -> int:
    """Which of the prefill kernel's three kv-block loops can run for ``problem``, as bits:
    1 the leading masked blocks, 2 the interior blocks, 4 the trailing masked blocks. The
    others are compiled out (an empty loop compiled in still costs registers and time).
    Conservative: a set bit only allows the loop to run."""
    if problem.mask is not None:
        return 1  # an explicit mask sends every block through the leading masked loop
    loops = 2
    if part_filled(problem, block_n):
        loops |= 4  # a ragged last block
    if problem.band is not None and problem.device_lengths is not None:
        return 7  # a band of lengths the host does not know
    if problem.band is not None:
        pre, nxt = (host_ints(t) for t in problem.band)
        if min(pre, default=0) < problem.max_q_len:
            loops |= 1  # the band's left edge cuts into some tile's keys
        if min(nxt, default=0) + 1 < problem.max_kv_len:
            loops |= 4  # its right edge (causal: the diagonal)
    return loops


def part_filled(problem: AttentionProblem, block_n: int) -> bool:
    """Whether some batch's last kv block holds fewer than ``block_n`` keys (PASA takes
    that block's row mean over its keys); lengths on the device: maybe."""
    if problem.device_lengths is not None:
        return True
    return any(n % block_n for n in host_ints(problem.kv_lens))


def row_constant_in_kernel(problem: AttentionProblem, block_n: int, tuning: Tuning) -> bool:
    """pasa-exact: compute c per block in the kv loop, without the workspace
    (``tuning.row_constant``)."""
    if not problem.allocation.exact_shift:
        return False
    if tuning.row_constant != "auto":
        return tuning.row_constant == "in-kernel"
    q, k, v = problem.query, problem.key, problem.value
    workspace = 4 * q.shape[0] * q.shape[1] * cdiv(problem.max_kv_len, block_n) * q.shape[2]
    kv_numel = k.numel() + v.numel()
    if problem.paged:  # the keys and values the batches use, not the whole caches
        kv_numel = problem.batch * k.shape[1] * problem.max_kv_len * (k.shape[3] + v.shape[3])
    return workspace > 2 * (q.numel() + kv_numel)


def fp_options(allocation: Allocation) -> dict:
    """Low-precision statistics round after every operation: no FMA contraction."""
    return {"enable_fp_fusion": False} if allocation.low_statistics else {}


def decode_shift_site(allocation: Allocation, tuning: Tuning) -> str:
    """Where the decode kernel applies ``allocation``'s shift under ``tuning``: "scores",
    "keys" (K' formed, and staged, in the kernel) or "none" (an unshifted allocation)."""
    return tuning.decode_shift if allocation.shifts_keys else "none"


def decode_stages(shift_site: str, head_dim: int, table_in_pipeline: bool = False) -> int:
    """Pipeline depth of the decode kernel that fits shared memory (:func:`decode_shift_site`:
    shifting the keys stages K' too). At 64 < d <= 128 four stages fit one program too, but
    decoded slower on an H200 than three (batch 8, 32 query heads, S2 = 8k and 32k), for
    pasa-exact, pasa and fa-fp32 alike; two programs of two stages per SM decoded pasa
    slower than one of three, paged and contiguous. ``table_in_pipeline``: the pipeliner stages the block table's loads
    (:func:`paged_stages`); the TMA loop loads its next entry itself, one block ahead, and
    keeps the contiguous depth: on shuffled cache blocks two and four stages decoded slower
    there than three (H200, S2 = 8k and 32k, all three allocations)."""
    stages = 2 if shift_site == "keys" else 3
    stages = stages - 1 if head_dim > 128 else stages
    return paged_stages(stages) if table_in_pipeline else stages


def paged_stages(stages: int) -> int:
    """num_stages for a kv loop that reads K/V through the block table: Triton's pipeliner
    gives the table's load a stage of its own in front of the K/V loads it addresses and
    splits the stages between the two, so 2s - 1 stages keep the K/V loads s - 1 ahead,
    as s stages keep them without a table (``tools/dev/triton_aot.py``: the same shared memory
    and residency)."""
    return 2 * stages - 1


def decode_block_g(group: int, head_dim: int) -> int:
    """Query heads per decode program (the rows of its tiles): the whole group up to a cap
    that keeps the kernel within an H100's shared memory and registers (64 rows overflow
    shared memory at d = 256 for ``fa-*`` and spill at d = 128). Larger groups are cut
    into several programs that read the same K/V blocks."""
    cap = 64 if head_dim <= 64 else 32 if head_dim <= 128 else 16
    return min(pow2(group), cap)


def decode_resident(shift_site: str, head_dim: int, block_g: int) -> int:
    """Programs of the decode kernel one H100 SM holds at once (4 warps), as its shared
    memory and registers allow:
    ``tools/dev/triton_aot.py`` reports this for every variant the launch can pick
    (:func:`decode_block_g`) and fails where it differs from this table."""
    if head_dim > 128:
        return 1
    if head_dim > 64:  # three stages of K and V tiles; shifting the keys: two, and K' besides
        return 2 if shift_site == "keys" else 1
    return 3 if block_g <= 16 else 2


def decode_splits(n_blocks: int, groups: int, sms: int, resident: int) -> int:
    """How many kv splits each of the ``groups`` (batch, kv head, chunk of the query group)
    is cut into: one wave of programs, ``resident`` per SM (:func:`decode_resident`), and
    no more splits than kv blocks. More programs than a wave leave a partial last wave, and
    more splits give each program fewer kv blocks to pipeline."""
    return max(1, min(n_blocks, resident * sms // groups))


def decode_programs(group: int, head_dim: int, shift_site: str, n_blocks: int, kv_groups: int,
                    sms: int) -> tuple[int, int, int, int]:
    """(block_g, n_chunks, n_splits, blocks_per_split) of the decode launch: ``group`` query
    heads per kv head in chunks of block_g rows (:func:`decode_block_g`), each of the
    ``kv_groups`` (batch, kv head) pairs' chunks cut into n_splits splits of blocks_per_split
    of the ``n_blocks`` kv blocks (:func:`decode_splits`), none of them empty."""
    block_g = decode_block_g(group, head_dim)
    n_chunks = cdiv(group, block_g)
    resident = decode_resident(shift_site, head_dim, block_g)
    n_splits = decode_splits(n_blocks, kv_groups * n_chunks, sms, resident)
    blocks_per_split = cdiv(n_blocks, n_splits)
    return block_g, n_chunks, cdiv(n_blocks, blocks_per_split), blocks_per_split
