"""Paged KV test cases: the keys and values of each request written into a paged cache
through a block table (non-contiguous physical blocks, a prefix block shared between
requests, unused rows filled with NaN), with the same tokens laid out contiguously, so that
the fp64 golden is computed without the block table."""
from __future__ import annotations

import math

import torch

import pasa_npu

# name -> case. Fields: layout (BNSD, BSND, BSH or TND), cache ("3d": (num_blocks,
# block_size, N_kv * D), "4d": (num_blocks, N_kv, block_size, D)), Nq, Nkv, D, block_size,
# q_lens and kv_lens per request (all q_lens 1: decode; the bottom-right q_len rows of the
# kv_len tokens otherwise), share: requests whose first block is request 0's, optional
# sparse_mode / pre / next.
PAGED_CASES = {
    "decode-bsh-3d": dict(layout="BSH", cache="3d", Nq=4, Nkv=2, D=32, block_size=16,
                          q_lens=[1, 1, 1], kv_lens=[75, 16, 40], share=[2]),
    "decode-bnsd-4d": dict(layout="BNSD", cache="4d", Nq=8, Nkv=2, D=32, block_size=128,
                           q_lens=[1, 1], kv_lens=[150, 200], share=[1]),
    "prefill-bnsd-4d-causal": dict(layout="BNSD", cache="4d", Nq=2, Nkv=1, D=32,
                                   block_size=128, q_lens=[40, 40], kv_lens=[170, 40],
                                   share=[], sparse_mode=3),
    "prefill-bsnd-3d-mode0": dict(layout="BSND", cache="3d", Nq=2, Nkv=2, D=32,
                                  block_size=128, q_lens=[30, 20], kv_lens=[140, 130],
                                  share=[1]),
    "tnd-mixed-3d-causal": dict(layout="TND", cache="3d", Nq=4, Nkv=2, D=32, block_size=128,
                                q_lens=[1, 36, 1, 20], kv_lens=[140, 170, 60, 20],
                                share=[1], sparse_mode=3),
    "tnd-mixed-4d-band": dict(layout="TND", cache="4d", Nq=2, Nkv=1, D=32, block_size=128,
                              q_lens=[24, 1, 30], kv_lens=[150, 129, 30], share=[1],
                              sparse_mode=4, pre=50, next=0),
    "tnd-mixed-4d-mode0": dict(layout="TND", cache="4d", Nq=2, Nkv=2, D=64, block_size=128,
                               q_lens=[1, 25], kv_lens=[200, 140], share=[1]),
}


def paged_case(case: dict, dtype: torch.dtype, seed: int = 0):
    """(query, key cache, value cache, kw, dense): the paged call's tensors and keyword
    arguments, and ``dense`` = (key, value, kw) of the same tokens laid out contiguously
    in the query's layout, for the golden."""
    gen = torch.Generator().manual_seed(seed)
    nq, nkv, d, size = case["Nq"], case["Nkv"], case["D"], case["block_size"]
    q_lens, kv_lens = case["q_lens"], case["kv_lens"]
    batch, width = len(kv_lens), max(kv_lens)
    keys, values = (torch.randn(batch, nkv, width, d, generator=gen).to(dtype)
                    for _ in range(2))
    for b in case["share"]:  # the first block holds the same tokens as request 0's
        keys[b, :, :size], values[b, :, :size] = keys[0, :, :size], values[0, :, :size]
    blocks = [-(-n // size) for n in kv_lens]
    table, num_blocks = _block_table(blocks, case["share"], gen)
    k_cache, v_cache = (paged_cache(t, kv_lens, table, size, num_blocks)
                        for t in (keys, values))
    if case["cache"] == "3d":
        k_cache, v_cache = (c.permute(0, 2, 1, 3).reshape(num_blocks, size, nkv * d)
                            for c in (k_cache, v_cache))

    kw = dict(num_heads=nq, num_key_value_heads=nkv, input_layout=case["layout"],
              scale=1 / math.sqrt(d), softmax_lse_flag=True)
    if "sparse_mode" in case:
        kw["sparse_mode"] = case["sparse_mode"]
        if case["sparse_mode"] in (3, 4):
            kw["atten_mask"] = pasa_npu.compressed_causal_mask()
    if "pre" in case:
        kw["pre_tokens"], kw["next_tokens"] = case["pre"], case["next"]
    queries = torch.randn(batch, nq, max(q_lens), d, generator=gen).to(dtype)
    if case["layout"] == "TND":
        q = torch.cat([queries[b, :, :n] for b, n in enumerate(q_lens)], 1).transpose(0, 1)
        k, v = (torch.cat([t[b, :, :n] for b, n in enumerate(kv_lens)], 1).transpose(0, 1)
                for t in (keys, values))
        dense_kw = dict(kw, actual_seq_lengths=_cumulative(q_lens),
                        actual_seq_lengths_kv=_cumulative(kv_lens))
        kw.update(actual_seq_lengths=_cumulative(q_lens), actual_seq_lengths_kv=kv_lens)
    else:
        q, k, v = (_in_layout(t, case["layout"]) for t in (queries, keys, values))
        kw.update(actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens)
        dense_kw = dict(kw)
    kw.update(block_table=table, block_size=size)
    return q.contiguous(), k_cache, v_cache, kw, (k.contiguous(), v.contiguous(), dense_kw)


def paged_cache(t: torch.Tensor, kv_lens: list, table: torch.Tensor, block_size: int,
                num_blocks: int) -> torch.Tensor:
    """A (num_blocks, N, block_size, D) cache, NaN wherever no token is written, holding
    the first ``kv_lens[b]`` tokens of each batch b of the (B, N, S, D) ``t`` in the
    physical blocks ``table`` names."""
    cache = torch.full((num_blocks, t.shape[1], block_size, t.shape[3]), math.nan,
                       dtype=t.dtype)
    for b, n in enumerate(kv_lens):
        for j in range(-(-n // block_size)):
            rows = t[b, :, j * block_size:min(n, (j + 1) * block_size)]
            cache[table[b, j], :, :rows.shape[1]] = rows
    return cache


def _block_table(blocks: list, share: list, gen: torch.Generator):
    """An int32 (B, max blocks + 1) table of distinct physical blocks in a shuffled order
    (spare blocks between them), except that requests in ``share`` take request 0's first
    block; the column past each request's blocks holds -1 (never read)."""
    num_blocks = 2 * sum(blocks) + 1
    free = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(blocks), max(blocks) + 1), -1, dtype=torch.int32)
    for b, n in enumerate(blocks):
        for j in range(n):
            table[b, j] = table[0, 0] if (j == 0 and b in share) else free.pop()
    return table, num_blocks


def _cumulative(lens: list) -> list:
    out, total = [], 0
    for n in lens:
        total += n
        out.append(total)
    return out


def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (B, N, S, D) tensor in ``layout``'s memory order and shape."""
    if layout == "BNSD":
        return t
    bsnd = t.transpose(1, 2)
    return bsnd if layout == "BSND" else bsnd.flatten(2)
