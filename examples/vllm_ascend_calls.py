"""vllm-ascend's attention calls, made through ``pasa_npu.patch_torch_npu`` on a stand-in
torch_npu, each step checked against dense fp64 attention.

The calls have the arguments vllm-ascend's attention backends pass (TND packing, cumulative
query lengths, per-request kv lengths over a paged cache of (num_blocks, block_size,
N_kv * D) with ``block_table``, the compressed 2048 x 2048 causal mask with
``sparse_mode=3``, a sliding window as ``sparse_mode=4`` with ``pre_tokens`` = the window
and ``next_tokens=0``, and for models with attention sinks the v2 interface with
``learnable_sink``):

* prefill without a cache (v1; keys and values are the new tokens);
* decode, one query per request (v1, paged);
* chunked prefill mixing a prompt chunk and decode rows in one call (v1, paged);
* sliding-window attention (v1, ``sparse_mode=4``);
* sinks: prefill and decode through ``npu_fused_infer_attention_score_v2`` (paged, causal or
  windowed; decode's query lengths as an int32 tensor, as vllm-ascend builds them);
* graph capture: the workspace query, then ``.out`` with that workspace and preallocated
  outputs (v1, and v2 with sinks);
* context parallel: ``torch.ops.npu.npu_fused_infer_attention_score`` called directly with
  ``softmax_lse_flag=True`` (output and LSE both checked).

Where torch_npu is not installed, a stand-in module takes its place, with the four
functions and ``torch.ops.npu`` operators of both names registered through torch.library;
its originals raise, so every call must reach PASA (the routing counts say so at the end).

    python examples/vllm_ascend_calls.py
"""
from __future__ import annotations

import math
import sys
import types

import torch

import pasa_npu
from pasa_npu import arguments, torch_npu_patch

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 64, 128
SCALE = 1 / math.sqrt(HEAD_DIM)
WINDOW = 48
SWA_INT_MAX = 2147483647
TOLERANCE = 5e-3  # relative RMSE against dense fp64 (pasa-exact, fp16)
NAME = "npu_fused_infer_attention_score"


# ----------------------------------------------------------------------------- stand-in


def _unreachable(name):
    def original(*args, **kwargs):
        raise RuntimeError(f"the stand-in torch_npu's {name} was reached: PASA did not take "
                           f"the call")
    original.out = original
    return original


def _schema(name: str, rows) -> tuple[str, str]:
    def argument(a):
        if a.kind == "lengths":
            return f"SymInt[]? {a.name}=None"
        if a.default is None:
            return (f"int? {a.name}=None" if a.name.endswith("_dtype")
                    else f"Tensor? {a.name}=None")
        default = f'"{a.default}"' if isinstance(a.default, str) else a.default
        return f"{ {int: 'int', float: 'float', str: 'str', bool: 'bool'}[type(a.default)] } {a.name}={default}"
    head = "Tensor query, Tensor key, Tensor value, *, " + ", ".join(argument(a) for a in rows)
    return (f"{name}({head}) -> (Tensor, Tensor)",
            f"{name}.out({head}, Tensor? workspace=None, Tensor(a!) attention_out, "
            f"Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))")


_LIBRARY = []


def install_stand_in() -> None:
    """A stand-in torch_npu in sys.modules, and torch.ops.npu operators of both names."""
    if "torch_npu" in sys.modules or _try_import_torch_npu():
        return
    module = types.ModuleType("torch_npu")
    for name in (NAME, f"{NAME}_v2", f"_{NAME}_get_max_workspace",
                 f"_{NAME}_v2_get_max_workspace"):
        setattr(module, name, _unreachable(f"torch_npu.{name}"))
    sys.modules["torch_npu"] = module
    lib = torch.library.Library("npu", "FRAGMENT")
    for name, rows in ((NAME, arguments.TORCH_NPU_ARGUMENTS),
                       (f"{NAME}_v2", arguments.V2_ARGUMENTS)):
        try:
            getattr(torch.ops.npu, name)
            continue  # already registered
        except AttributeError:
            pass
        for schema in _schema(name, rows):
            lib.define(schema)
        lib.impl(name, _unreachable(f"torch.ops.npu.{name}"), "CompositeExplicitAutograd")
        lib.impl(f"{name}.out", _unreachable(f"torch.ops.npu.{name}.out"),
                 "CompositeExplicitAutograd")
    _LIBRARY.append(lib)


def _try_import_torch_npu() -> bool:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- the cache


class Requests:
    """Each request's tokens (contiguous, for the dense check) and a paged cache holding
    the same keys and values, as vllm-ascend's (num_blocks, block_size, N_kv * D)."""

    def __init__(self, num_blocks: int = 32, seed: int = 0):
        self.gen = torch.Generator().manual_seed(seed)
        width = NUM_KV_HEADS * HEAD_DIM
        self.key_cache = torch.zeros(num_blocks, BLOCK_SIZE, width, dtype=torch.float16)
        self.value_cache = torch.zeros_like(self.key_cache)
        self.free = list(range(num_blocks))[::-1]
        self.keys, self.values, self.blocks = {}, {}, {}

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen).half()

    def append(self, r: int, n: int):
        """n new tokens of request r: their (n, N_kv, D) keys and values, also cached."""
        k, v = self.randn(n, NUM_KV_HEADS, HEAD_DIM), self.randn(n, NUM_KV_HEADS, HEAD_DIM)
        start = len(self.keys.get(r, ()))
        self.keys[r] = torch.cat([self.keys[r], k]) if r in self.keys else k
        self.values[r] = torch.cat([self.values[r], v]) if r in self.values else v
        blocks = self.blocks.setdefault(r, [])
        for pos in range(start, start + n):
            if pos // BLOCK_SIZE >= len(blocks):
                blocks.append(self.free.pop())
            block, row = blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE
            self.key_cache[block, row] = k[pos - start].flatten()
            self.value_cache[block, row] = v[pos - start].flatten()
        return k, v

    def table(self, rs) -> torch.Tensor:
        width = max(len(self.blocks[r]) for r in rs)
        return torch.tensor([self.blocks[r] + [0] * (width - len(self.blocks[r])) for r in rs],
                            dtype=torch.int32)


def dense(q, k, v, window=None, sink=None):
    """fp64 attention of one request's queries (the last q.shape[0] positions of its
    k.shape[0] tokens), causal bottom-right, optionally windowed and with sinks:
    (out (S1, N, D), lse (S1, N))."""
    s1, s2 = q.shape[0], k.shape[0]
    group = NUM_HEADS // NUM_KV_HEADS
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("ind,jnd->nij", q.double(), kk) * SCALE
    i = torch.arange(s1)[:, None] + (s2 - s1)
    j = torch.arange(s2)[None, :]
    visible = (j <= i) & ((i - j <= window) if window is not None else True)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        scores = torch.cat([scores, sink.double().view(-1, 1, 1).expand(-1, s1, 1)], dim=2)
        vv = torch.cat([vv, torch.zeros(1, *vv.shape[1:], dtype=torch.float64)])
    p = torch.softmax(scores, dim=2)
    return torch.einsum("nij,jnd->ind", p, vv), torch.logsumexp(scores, dim=2).T


def check(step: str, out, queries, reqs, rs, window=None, sink=None, lse=None):
    """Each request's rows of a packed output (and LSE) against dense fp64 attention."""
    start, worst = 0, 0.0
    for r, q in zip(rs, queries):
        n = q.shape[0]
        want, want_lse = dense(q, reqs.keys[r], reqs.values[r], window, sink)
        got = out[start:start + n].double()
        worst = max(worst, float((got - want).norm() / want.norm()))
        if lse is not None:
            err = float((lse[start:start + n, :, 0].double() - want_lse).abs().max())
            assert err < 1e-2, f"{step}: request {r}'s LSE is off by {err:.3g}"
        start += n
    assert worst < TOLERANCE, f"{step}: relative RMSE {worst:.3g} over {TOLERANCE}"
    print(f"{step:<46} rel. RMSE {worst:.2e}")


# ----------------------------------------------------------------------------- the calls


def _cum(lengths):
    out, total = [], 0
    for n in lengths:
        total += n
        out.append(total)
    return out


def run() -> dict:
    import torch_npu

    reqs = Requests()
    mask = pasa_npu.compressed_causal_mask()
    common = dict(num_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS, scale=SCALE,
                  input_layout="TND")
    common_v2 = dict(num_query_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
                     softmax_scale=SCALE, input_layout="TND")
    sinks = torch.tensor([-1.0, 0.5, 2.0, 1.0], dtype=torch.bfloat16)

    # 1. prefill without a cache: the new tokens are the keys and values
    prompts = {0: 200, 1: 70}
    queries = [reqs.randn(n, NUM_HEADS, HEAD_DIM) for n in prompts.values()]
    kv = [reqs.append(r, n) for r, n in prompts.items()]
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=torch.cat(queries), key=torch.cat([k for k, _ in kv]),
        value=torch.cat([v for _, v in kv]), atten_mask=mask, sparse_mode=3,
        actual_seq_lengths=_cum(prompts.values()), actual_seq_lengths_kv=_cum(prompts.values()),
        **common)
    check("prefill (v1, no cache)", out, queries, reqs, list(prompts))

    # 2. decode: one query per request over the paged cache
    rs = [0, 1]
    queries = [reqs.randn(1, NUM_HEADS, HEAD_DIM) for _ in rs]
    for r in rs:
        reqs.append(r, 1)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=torch.cat(queries), key=reqs.key_cache, value=reqs.value_cache,
        block_table=reqs.table(rs), block_size=BLOCK_SIZE, atten_mask=mask, sparse_mode=3,
        actual_seq_lengths=_cum([1, 1]), actual_seq_lengths_kv=[len(reqs.keys[r]) for r in rs],
        **common)
    check("decode (v1, paged)", out, queries, reqs, rs)

    # 3. chunked prefill: a new request's first chunk beside two decode rows
    rs, lengths = [0, 1, 2], [1, 1, 96]
    queries = [reqs.randn(n, NUM_HEADS, HEAD_DIM) for n in lengths]
    for r, n in zip(rs, lengths):
        reqs.append(r, n)
    kv_lens = [len(reqs.keys[r]) for r in rs]
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=torch.cat(queries), key=reqs.key_cache, value=reqs.value_cache,
        block_table=reqs.table(rs), block_size=BLOCK_SIZE, atten_mask=mask, sparse_mode=3,
        actual_seq_lengths=_cum(lengths), actual_seq_lengths_kv=kv_lens, **common)
    check("chunked prefill + decode (v1, paged)", out, queries, reqs, rs)

    # 4. a sliding window: band mask, pre_tokens = the window, next_tokens = 0
    rs, lengths = [0, 2], [1, 64]
    queries = [reqs.randn(n, NUM_HEADS, HEAD_DIM) for n in lengths]
    for r, n in zip(rs, lengths):
        reqs.append(r, n)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=torch.cat(queries), key=reqs.key_cache, value=reqs.value_cache,
        block_table=reqs.table(rs), block_size=BLOCK_SIZE, atten_mask=mask, sparse_mode=4,
        pre_tokens=WINDOW, next_tokens=0, actual_seq_lengths=_cum(lengths),
        actual_seq_lengths_kv=[len(reqs.keys[r]) for r in rs], **common)
    check("sliding window (v1, sparse_mode 4)", out, queries, reqs, rs, window=WINDOW)

    # 5. sinks through v2: a chunked prefill, then decode with a window
    for window in (None, WINDOW):
        rs, lengths = ([0, 1, 2], [1, 1, 32]) if window is None else ([0, 1, 2], [1, 1, 1])
        queries = [reqs.randn(n, NUM_HEADS, HEAD_DIM) for n in lengths]
        for r, n in zip(rs, lengths):
            reqs.append(r, n)
        qlen = (_cum(lengths) if window is None
                else torch.tensor([1] * len(rs), dtype=torch.int32).cumsum(dim=0))
        out, _ = torch_npu.npu_fused_infer_attention_score_v2(
            torch.cat(queries), reqs.key_cache.contiguous(), reqs.value_cache.contiguous(),
            atten_mask=mask, sparse_mode=4 if window else 3,
            pre_tokens=window if window else SWA_INT_MAX, next_tokens=0,
            block_table=reqs.table(rs), block_size=BLOCK_SIZE, actual_seq_qlen=qlen,
            actual_seq_kvlen=[len(reqs.keys[r]) for r in rs], learnable_sink=sinks,
            **common_v2)
        what = "decode, window" if window else "chunked prefill"
        check(f"sinks (v2, {what})", out, queries, reqs, rs, window=window, sink=sinks)

    # 6. graph capture: the workspace query, then .out into preallocated outputs
    rs = [0, 1, 2]
    queries = [reqs.randn(1, NUM_HEADS, HEAD_DIM) for _ in rs]
    for r in rs:
        reqs.append(r, 1)
    kv_lens = [len(reqs.keys[r]) for r in rs]
    query = torch.cat(queries)
    v1_args = dict(query=query, key=reqs.key_cache, value=reqs.value_cache, atten_mask=mask,
                   block_table=reqs.table(rs), block_size=BLOCK_SIZE, sparse_mode=3,
                   actual_seq_lengths=_cum([1] * 3), actual_seq_lengths_kv=kv_lens, **common)
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(**v1_args)
    output, lse = torch.empty_like(query), torch.empty(1, dtype=query.dtype)
    torch_npu.npu_fused_infer_attention_score.out(**v1_args, workspace=workspace,
                                                  out=[output, lse])
    check("graph capture (v1 .out, workspace)", output, queries, reqs, rs)
    v2_args = dict(query=query, key=reqs.key_cache, value=reqs.value_cache, atten_mask=mask,
                   block_table=reqs.table(rs), block_size=BLOCK_SIZE, sparse_mode=3,
                   pre_tokens=SWA_INT_MAX, next_tokens=0, actual_seq_qlen=_cum([1] * 3),
                   actual_seq_kvlen=kv_lens, learnable_sink=sinks, **common_v2)
    workspace = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(**v2_args)
    output.zero_()
    torch_npu.npu_fused_infer_attention_score_v2.out(**v2_args, workspace=workspace,
                                                     out=[output, lse])
    check("graph capture (v2 .out, workspace, sinks)", output, queries, reqs, rs, sink=sinks)

    # 7. context parallel: torch.ops.npu called directly, with the LSE
    rs, lengths = [3, 4], [40, 90]
    queries = [reqs.randn(n, NUM_HEADS, HEAD_DIM) for n in lengths]
    kv = [reqs.append(r, n) for r, n in zip(rs, lengths)]
    out, lse = torch.ops.npu.npu_fused_infer_attention_score(
        torch.cat(queries), torch.cat([k for k, _ in kv]).contiguous(),
        torch.cat([v for _, v in kv]).contiguous(), num_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS, input_layout="TND", atten_mask=mask, scale=SCALE,
        sparse_mode=3, antiquant_mode=0, antiquant_scale=None, softmax_lse_flag=True,
        actual_seq_lengths_kv=_cum(lengths), actual_seq_lengths=_cum(lengths))
    check("context parallel (torch.ops.npu, LSE)", out, queries, reqs, rs, lse=lse)
    return torch_npu_patch.routing_counts()


def main() -> None:
    install_stand_in()
    torch_npu_patch.reset_routing_counts()
    with pasa_npu.patch_torch_npu(backend="torch"):
        counts = run()
    for route, count in sorted(counts.items()):
        print(f"  {route}: {count}")
    assert all(set(c) == {"pasa"} for c in counts.values()), counts
    print("every call reached PASA and matched dense attention")


if __name__ == "__main__":
    main()
