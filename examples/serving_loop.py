"""A toy serving loop over a paged KV cache, the way vllm-ascend calls
``npu_fused_infer_attention_score``: every step packs the scheduled requests into one TND
call, with ``block_table`` and ``block_size``, the cache as (num_blocks, block_size, N_kv * D),
per-request ``actual_seq_lengths_kv`` and causal attention aligned bottom-right
(``sparse_mode=3``), so that chunked prefill (a chunk of queries after the tokens already in
the cache) and decode (one query) share the call.

:class:`PagedCache` allocates blocks as requests append tokens and frees them when a request
finishes; later requests reuse the freed blocks (stale rows the table no longer names).
Two requests share a prompt prefix: the second maps the first's full prefix blocks into its
table (reference counted) instead of writing them again. The queries, keys and values are
random tokens, not a model. Every step checks each request's output against dense fp64
attention over the same tokens, kept contiguously beside the cache.

    python examples/serving_loop.py                       # CPU, the torch backend
    python examples/serving_loop.py --device cuda         # GPU, the Triton backend
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import torch

import pasa_npu

BLOCK_SIZE = 128    # torch_npu takes multiples of 128 up to 512 when a query has S1 > 1
CHUNK = 96          # prefill tokens per request per step (chunked prefill)
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 64
#: (prompt length, tokens to generate, step it arrives at); request 1 shares request 0's
#: first prompt block (a common system prompt), full by the time request 1 arrives
REQUESTS = ((300, 3, 0), (200, 4, 2), (40, 5, 1), (150, 2, 7))
SHARED_PREFIX = {1: 0}
#: relative RMSE of each step's output against dense fp64 attention
TOLERANCE = {"fa-fp32": 2e-3, "pasa": 2e-2, "pasa-exact": 5e-3}


class PagedCache:
    """Fixed-size blocks of K and V in torch_npu's (num_blocks, block_size, N_kv * D) cache
    shape, a free list, and a block table per request (blocks are reference counted, so a
    shared prefix block is freed by its last user)."""

    def __init__(self, num_blocks: int, dtype: torch.dtype, device: str):
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS * HEAD_DIM)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)
        self.free = list(range(num_blocks - 1, -1, -1))
        self.refs = [0] * num_blocks
        self.tables: dict[int, list] = {}
        self.lengths: dict[int, int] = {}

    def allocate(self, rid: int, prefix_of: int | None = None, prefix_len: int = 0) -> None:
        """Open request ``rid``; with ``prefix_of``, map that request's first
        ``prefix_len // BLOCK_SIZE`` full blocks into its table (their tokens are equal)."""
        shared = self.tables[prefix_of][:prefix_len // BLOCK_SIZE] if prefix_of is not None else []
        for block in shared:
            self.refs[block] += 1
        self.tables[rid] = list(shared)
        self.lengths[rid] = len(shared) * BLOCK_SIZE

    def append(self, rid: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write tokens (n, N_kv * D) at the end of request ``rid``, taking blocks as needed."""
        for k_row, v_row in zip(key, value):
            n = self.lengths[rid]
            if n == len(self.tables[rid]) * BLOCK_SIZE:
                if not self.free:
                    raise RuntimeError("the paged cache is out of blocks")
                block = self.free.pop()
                self.refs[block] = 1
                self.tables[rid].append(block)
            block = self.tables[rid][n // BLOCK_SIZE]
            self.key[block, n % BLOCK_SIZE] = k_row
            self.value[block, n % BLOCK_SIZE] = v_row
            self.lengths[rid] = n + 1

    def release(self, rid: int) -> None:
        """Close request ``rid``: its blocks go back to the free list once unreferenced."""
        for block in self.tables.pop(rid):
            self.refs[block] -= 1
            if not self.refs[block]:
                self.free.append(block)
        del self.lengths[rid]

    def block_table(self, rids: list) -> torch.Tensor:
        """int32 (len(rids), max blocks): the requests' tables, padded with 0 (never read)."""
        width = max(len(self.tables[r]) for r in rids)
        rows = [self.tables[r] + [0] * (width - len(self.tables[r])) for r in rids]
        return torch.tensor(rows, dtype=torch.int32, device=self.key.device)


@dataclass
class Request:
    """One request's random tokens and the contiguous copy of its keys and values."""

    rid: int
    prompt: int
    new_tokens: int
    tokens: int = 0          # tokens written to the cache so far
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.tokens >= self.prompt + self.new_tokens

    def next_queries(self) -> int:
        """Queries this step: the next prefill chunk, or one decode token."""
        return min(CHUNK, self.prompt - self.tokens) if self.tokens < self.prompt else 1


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp64 causal attention of the last ``q.shape[0]`` positions over all of ``k``: q
    (S1, Nq, D), k and v (S2, N_kv, D), bottom-right aligned; (S1, Nq, D)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(HEAD_DIM)
    i = torch.arange(q.shape[0])[:, None] + (k.shape[0] - q.shape[0])
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > i, -math.inf)
    return torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)


def _tokens(gen: torch.Generator, n: int, heads: int, dtype) -> torch.Tensor:
    return torch.randn(n, heads, HEAD_DIM, generator=gen).to(dtype)


def step(cache: PagedCache, batch: list, gen: torch.Generator, algorithm: str,
         backend: str, dtype) -> list:
    """One mixed step: append each request's new tokens, one TND call, and each request's
    relative RMSE against :func:`dense_attention`."""
    queries, q_cum, kv_lens = [], [], []
    for req in batch:
        n = req.next_queries()
        k, v = (_tokens(gen, n, NUM_KV_HEADS, dtype) for _ in range(2))
        cache.append(req.rid, k.flatten(1).to(cache.key.device),
                     v.flatten(1).to(cache.key.device))
        req.keys.append(k)
        req.values.append(v)
        req.tokens += n
        queries.append(_tokens(gen, n, NUM_HEADS, dtype))
        q_cum.append((q_cum[-1] if q_cum else 0) + n)
        kv_lens.append(req.tokens)
    device = cache.key.device
    out, _ = pasa_npu.fused_attention(
        torch.cat(queries).to(device), cache.key, cache.value, num_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS, input_layout="TND", scale=1 / math.sqrt(HEAD_DIM),
        actual_seq_lengths=q_cum, actual_seq_lengths_kv=kv_lens, sparse_mode=3,
        atten_mask=pasa_npu.compressed_causal_mask().to(device),
        block_table=cache.block_table([r.rid for r in batch]), block_size=BLOCK_SIZE,
        algorithm=algorithm, backend=backend)
    errors, start = [], 0
    for req, q in zip(batch, queries):
        want = dense_attention(q, torch.cat(req.keys), torch.cat(req.values))
        got = out[start:start + q.shape[0]].cpu().double()
        errors.append(float((got - want).norm() / want.norm()))
        start += q.shape[0]
    return errors


def serve(device: str = "cpu", algorithm: str = "pasa", backend: str = "auto",
          dtype=torch.float16, seed: int = 0, log=print) -> list:
    """Run :data:`REQUESTS` to completion; returns every (step, request, queries, kv length,
    error) and raises if an error passes :data:`TOLERANCE`."""
    gen = torch.Generator().manual_seed(seed)
    cache = PagedCache(num_blocks=12, dtype=dtype, device=device)
    waiting = [Request(rid, prompt, new) for rid, (prompt, new, _) in enumerate(REQUESTS)]
    arrive = {rid: at for rid, (_, _, at) in enumerate(REQUESTS)}
    running, records, t = [], [], 0
    while waiting or running:
        for req in [r for r in waiting if arrive[r.rid] <= t]:
            source = SHARED_PREFIX.get(req.rid)
            if source is not None:  # request 1 repeats request 0's first block of tokens
                owner = next(r for r in running if r.rid == source)
                req.keys.append(torch.cat(owner.keys)[:BLOCK_SIZE])
                req.values.append(torch.cat(owner.values)[:BLOCK_SIZE])
            cache.allocate(req.rid, source, BLOCK_SIZE if source is not None else 0)
            req.tokens = cache.lengths[req.rid]  # the shared prefix is already cached
            waiting.remove(req)
            running.append(req)
        shapes = [(r.rid, r.next_queries()) for r in running]
        errors = step(cache, running, gen, algorithm, backend, dtype)
        for (rid, n), req, err in zip(shapes, running, errors):
            records.append((t, rid, n, req.tokens, err))
            log(f"step {t}: request {rid} {'decode' if n == 1 else 'prefill'} q={n:3d} "
                f"kv={req.tokens:3d} blocks={cache.tables[rid]} rel. RMSE {err:.2e}")
            if err > TOLERANCE[algorithm]:
                raise AssertionError(f"step {t}, request {rid}: relative RMSE {err:.3g} > "
                                     f"{TOLERANCE[algorithm]}")
        for req in [r for r in running if r.done]:
            cache.release(req.rid)
            running.remove(req)
        t += 1
    if len(cache.free) != len(cache.refs):
        raise AssertionError("blocks leaked: not every block is free at the end")
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--algorithm", default="pasa", choices=sorted(TOLERANCE))
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)
    serve(args.device, args.algorithm, args.backend)
    print("every step matches dense attention over the same tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
