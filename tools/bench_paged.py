"""``pasa-bench``'s paged KV cells: the same inputs as a contiguous case, copied into a paged
cache of ``BLOCK_SIZE``-token blocks in a shuffled order (every block of every batch in a
random physical block), read by ``fused_attention`` through ``block_table`` on the device,
as serving engines call it. Reported next to the contiguous figures of the same case.
"""
from __future__ import annotations

import torch

BLOCK_SIZE = 128
#: allocations with compiled paged variants (tools/dev/triton_aot.py)
PAGED_ALGORITHMS = ("pasa-exact", "pasa", "fa-fp32")
#: torch_npu's two cache shapes: (num_blocks, N_kv, block_size, D) and
#: (num_blocks, block_size, N_kv * D)
CACHE_SHAPES = ("4d", "3d")


def paged_kv(k: torch.Tensor, v: torch.Tensor, gen: torch.Generator, cache_shape: str = "4d",
             order: torch.Tensor = None):
    """(key cache, value cache, block table): BNSD ``k`` and ``v`` (B, N_kv, S, D), S a
    multiple of BLOCK_SIZE, in shuffled physical blocks of a ``cache_shape`` cache; with
    ``order``, logical block i of the flattened (batch, block) sequence lies at physical
    block ``order[i]`` instead (``gen`` unused)."""
    b, n_kv, s, d = k.shape
    per_batch = s // BLOCK_SIZE
    if order is None:
        order = torch.randperm(b * per_batch, generator=gen, device=k.device)
    caches = []
    for t in (k, v):
        blocks = t.unflatten(2, (per_batch, BLOCK_SIZE)).permute(0, 2, 1, 3, 4) \
            .reshape(b * per_batch, n_kv, BLOCK_SIZE, d)
        cache = torch.empty_like(blocks)
        cache[order] = blocks
        if cache_shape == "3d":
            cache = cache.permute(0, 2, 1, 3).reshape(b * per_batch, BLOCK_SIZE, n_kv * d)
        caches.append(cache)
    table = order.view(b, per_batch).to(torch.int32)
    return caches[0], caches[1], table


def paged_call(algorithm: str, mask, table: torch.Tensor, heads: int, kv_heads: int,
               head_dim: int, **options):
    """A candidate with pasa-bench's call signature that passes K/V as paged caches, for
    ``heads`` query heads, ``kv_heads`` kv heads and ``head_dim`` (``options``: further
    keyword arguments, e.g. ``repair_overflow``): :func:`~pasa_npu.tools.bench.ours_call`
    with the table, its block size and the kv lengths it covers."""
    from pasa_npu.tools.bench import ours_call  # here: bench imports this module

    return ours_call(algorithm, mask, heads, kv_heads, head_dim, block_table=table,
                     block_size=BLOCK_SIZE,
                     actual_seq_lengths_kv=[table.shape[1] * BLOCK_SIZE] * table.shape[0],
                     **options)


def markdown(result) -> list:
    """The paged table's lines: for each case with paged cells, each paged candidate's
    figure and its ratio to the same candidate on contiguous K/V (decode: GB/s of K+V as a
    share of copy bandwidth, graph replay; prefill: TFLOP/s)."""
    from pasa_npu.tools.bench_report import mask_text  # here: bench_report imports this module

    rows = [r for r in result["rows"] if any(k.endswith(" paged") for k in r)]
    if not rows:
        return []
    names = [a for a in PAGED_ALGORITHMS if any(f"{a} paged" in r for r in rows)]
    lines = ["", f"Paged KV ({result.get('paged_cache', '4d')} cache, block_size {BLOCK_SIZE}, "
             "shuffled blocks, table on the device): paged figure (decode: share of copy "
             "bandwidth, graph replay; prefill: TFLOP/s called eagerly); ratio paged / "
             "contiguous (prefill: eager [graph replay]):", "",
             "| case | " + " | ".join(f"{a} paged" for a in names) + " |",
             "|" + "---|" * (len(names) + 1)]
    for row in rows:
        unit = "gbs" if row["kind"] == "decode" else "tflops"
        case = (f"decode S2={row['s']} GQA {row['ratio']}:1" if row["kind"] == "decode" else
                f"prefill d={row['d']} S={row['s']} {mask_text(row)}")
        cells = []
        for name in names:
            paged, plain = row.get(f"{name} paged", {}), row.get(name, {})
            if unit not in paged:
                cells.append("error" if f"{name} paged" in row else "")
                continue
            text = f"{paged[unit]:.0f}"
            if unit == "gbs":
                text += f" ({paged[unit] / result['copy_gbs']:.0%})"
            if unit in plain:
                text += f"; {paged[unit] / plain[unit]:.2f}"
            if "graph_tflops" in paged and "graph_tflops" in plain:
                text += f" [{paged['graph_tflops'] / plain['graph_tflops']:.2f}]"
            cells.append(text)
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines
