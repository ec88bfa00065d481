"""Paged-KV problems for the kernel backends, built as the API layer's paged contract
describes (pasa_npu/problem.py): the dense problem of a call, with K and V moved into
block caches read through a block table. Until the API layer takes ``block_table`` itself,
this is how the AscendC kernels' paged path is driven."""
from __future__ import annotations

import dataclasses
import math
from unittest import mock

import torch

import pasa_npu
from pasa_npu import plans
from pasa_npu.problem import AttentionProblem


def dense_problem(q, k, v, **kw) -> AttentionProblem:
    """The AttentionProblem the API layer builds for ``fused_attention(q, k, v, **kw)``, run
    on the torch backend (its ``out`` and ``lse`` hold that backend's raw result)."""
    captured = []

    def capture(**fields):
        captured.append(AttentionProblem(**fields))
        return captured[-1]

    with mock.patch.object(plans, "AttentionProblem", capture), mock.patch.dict(plans.PLANS, clear=True):
        pasa_npu.fused_attention(q, k, v, backend="torch", **kw)
    return captured[-1]


def block_table(kv_lens, block_size: int, shared_prefix: int = 0, seed: int = 0):
    """(table (B, max_blocks) int32, num_blocks): each sequence's blocks at shuffled physical
    positions (non-contiguous), the first ``shared_prefix`` blocks of every sequence the same
    physical blocks; unused entries point at block 0."""
    gen = torch.Generator().manual_seed(seed)
    counts = [max(1, math.ceil(n / block_size)) for n in kv_lens]
    width = max(counts)
    own = sum(c - min(shared_prefix, c) for c in counts)
    num_blocks = shared_prefix + own + 1
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    prefix = free[:shared_prefix]
    rest = iter(free[shared_prefix:])
    table = torch.zeros(len(kv_lens), width, dtype=torch.int32)
    for b, c in enumerate(counts):
        for e in range(c):
            table[b, e] = prefix[e] if e < shared_prefix else next(rest)
    return table, num_blocks


def paged_problem(dense: AttentionProblem, block_size: int, cache_shape: str = "BNSD",
                  shared_prefix: int = 0, seed: int = 0) -> AttentionProblem:
    """``dense`` with K and V in caches of ``block_size`` rows a block: ``cache_shape`` "BNSD"
    stores (num_blocks, N_kv, block_size, D), "BSH" (num_blocks, block_size, N_kv * D). With
    ``shared_prefix`` blocks shared, every sequence's keys there are the first sequence's (so
    that the shared memory holds what each of them attends to). Returns (the paged problem,
    the dense problem over the same keys), each with fresh out and lse."""
    kv_lens = dense.kv_lens.tolist()
    table, num_blocks = block_table(kv_lens, block_size, shared_prefix, seed)
    key, value = dense.key.clone(), dense.value.clone()
    starts = dense.kv_starts.tolist()
    sequence = lambda x, b: x[0, :, starts[b]:] if dense.packed else x[b]  # noqa: E731
    n_shared = shared_prefix * block_size
    for b in range(1, len(kv_lens)):
        for x in (key, value):
            sequence(x, b)[:, :n_shared] = sequence(x, 0)[:, :n_shared]
    caches = []
    for x in (key, value):
        n_kv, d = x.shape[1], x.shape[3]
        cache = torch.zeros(num_blocks, n_kv, block_size, d, dtype=x.dtype)
        for b, n in enumerate(kv_lens):
            for e in range(math.ceil(n / block_size)):
                rows = sequence(x, b)[:, e * block_size:min(n, (e + 1) * block_size)]
                cache[int(table[b, e]), :, :rows.shape[1]] = rows
        if cache_shape == "BSH":  # (num_blocks, block_size, N_kv D), viewed as (blocks, N_kv, bs, D)
            cache = cache.permute(0, 2, 1, 3).contiguous().view(num_blocks, block_size, n_kv * d)
            cache = cache.view(num_blocks, block_size, n_kv, d).permute(0, 2, 1, 3)
        caches.append(cache)
    paged = dataclasses.replace(dense, key=caches[0], value=caches[1], block_table=table,
                                block_size=block_size, kv_starts=torch.zeros_like(dense.kv_starts),
                                **fresh_outputs(dense))
    return paged, dataclasses.replace(dense, key=key, value=value, **fresh_outputs(dense))


def fresh_outputs(problem: AttentionProblem) -> dict:
    """New out (zeros) and lse (-inf) tensors shaped and strided as ``problem``'s."""
    out = torch.zeros_like(problem.out)
    lse = None if problem.lse is None else torch.full_like(problem.lse, -math.inf)
    return dict(out=out, lse=lse)
