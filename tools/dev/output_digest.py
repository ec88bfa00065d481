"""``python -m pasa_npu.tools.dev.output_digest``: a fingerprint of every output, to show that a
change computes the same bytes.

Runs a fixed matrix of calls through the public API (prefill and decode; BNSD, BSH, TND;
GQA; causal, band and explicit masks; ragged and paged lengths; fp16 and bf16; scores large
enough to trigger the overflow repair) for each allocation on one backend, and prints the
SHA-256 of each call's output and LSE bytes. Inputs come from a seeded CPU generator, so two
checkouts on the same machine see the same inputs: ``--compare A.json B.json`` lists the
calls whose bytes differ (exit 1 if any).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys

import torch

import pasa_npu

ALGORITHMS = ("pasa", "pasa-mixed", "pasa-exact", "fa-fp32", "fa-fp16s", "fa-fp16")

#: name -> (layout, B, Nq, Nkv, S1, S2, D, extra keywords); "paged" pages K and V in
#: blocks of 128; "bias" adds a shared offset of that size to every key
CASES = {
    "prefill-bnsd-d128": ("BNSD", 2, 4, 4, 300, 300, 128, {}),
    "prefill-bnsd-d64-causal": ("BNSD", 1, 4, 2, 384, 384, 64, {"sparse_mode": 3}),
    "prefill-bsh-gqa-d128-causal": ("BSH", 1, 8, 2, 256, 512, 128, {"sparse_mode": 3}),
    "prefill-bsnd-d32-band": ("BSND", 1, 2, 2, 260, 260, 32,
                              {"sparse_mode": 4, "pre_tokens": 64, "next_tokens": 0}),
    "prefill-bnsd-d80-ragged": ("BNSD", 2, 2, 2, 200, 333, 80,
                                {"actual_seq_lengths": [77, 200],
                                 "actual_seq_lengths_kv": [13, 333]}),
    "prefill-bnsd-mask4d": ("BNSD", 2, 2, 2, 90, 160, 64, {"mask": "random4d"}),
    "prefill-tnd": ("TND", 0, 4, 2, 0, 0, 64, {"q_cum": [5, 135, 199],
                                              "kv_cum": [40, 240, 304]}),
    "prefill-bsh-paged": ("BSH", 2, 4, 2, 64, 640, 128, {"paged": True,
                                                         "actual_seq_lengths_kv": [640, 300]}),
    "prefill-bnsd-bias": ("BNSD", 1, 2, 2, 256, 512, 128, {"bias": 400.0}),
    "decode-bsh-gqa": ("BSH", 4, 32, 8, 1, 2000, 128, {"actual_seq_lengths_kv":
                                                       [2000, 1500, 777, 1]}),
    "decode-bnsd-d64": ("BNSD", 2, 8, 2, 1, 4096, 64, {}),
    "decode-bsh-paged": ("BSH", 4, 16, 4, 1, 1280, 128, {"paged": True,
                                                         "actual_seq_lengths_kv":
                                                         [1280, 1000, 129, 5]}),
    "decode-bnsd-bias": ("BNSD", 2, 8, 2, 1, 1024, 128, {"bias": 400.0}),
}
DTYPES = (torch.float16, torch.bfloat16)


def _inputs(layout, b, nq, nkv, s1, s2, d, extra, dtype, gen):
    """(query, key, value, keywords) of one case on the CPU, from ``gen``."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    kw = dict(num_heads=nq, num_key_value_heads=nkv, input_layout=layout, scale=d ** -0.5,
              softmax_lse_flag=True)
    if layout == "TND":
        q_cum, kv_cum = extra["q_cum"], extra["kv_cum"]
        q, k, v = randn(q_cum[-1], nq, d), randn(kv_cum[-1], nkv, d), randn(kv_cum[-1], nkv, d)
        kw.update(actual_seq_lengths=q_cum, actual_seq_lengths_kv=kv_cum)
    else:
        q, k, v = randn(b, nq, s1, d), randn(b, nkv, s2, d), randn(b, nkv, s2, d)
        if "bias" in extra:
            k = k + extra["bias"] * randn(1, 1, 1, d).abs()
        for name in ("actual_seq_lengths", "actual_seq_lengths_kv", "sparse_mode",
                     "pre_tokens", "next_tokens"):
            if name in extra:
                kw[name] = extra[name]
        if kw.get("sparse_mode") in (2, 3, 4):
            kw["atten_mask"] = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        if extra.get("mask") == "random4d":
            kw["atten_mask"] = torch.rand(b, 1, s1, s2, generator=gen) < 0.3
        if extra.get("paged"):  # (num_blocks, block_size, H) caches, blocks shuffled
            bs, blocks = 128, s2 // 128
            order = torch.randperm(b * blocks, generator=gen)
            kw.update(block_table=order.view(b, blocks).to(torch.int32), block_size=bs)
            k, v = (_paged(t, order, bs) for t in (k, v))
        if layout == "BSH":
            q = q.transpose(1, 2).reshape(b, s1, nq * d)
            if not extra.get("paged"):
                k = k.transpose(1, 2).reshape(b, s2, nkv * d)
                v = v.transpose(1, 2).reshape(b, s2, nkv * d)
        elif layout == "BSND":
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q.to(dtype), k.to(dtype), v.to(dtype), kw


def _paged(t: torch.Tensor, order: torch.Tensor, bs: int) -> torch.Tensor:
    """(B, N, S, D) as a paged cache whose block ``order[i]`` holds the i-th block."""
    b, n, s, d = t.shape
    blocks = t.view(b, n, s // bs, bs, d).permute(0, 2, 3, 1, 4).reshape(-1, bs, n * d)
    cache = torch.empty_like(blocks)
    cache[order] = blocks
    return cache


def _sha(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def digest(backend: str, device: str, algorithms=ALGORITHMS) -> dict:
    """{"case/dtype/algorithm": "out-sha lse-sha" or "refused: ..."}, every case run."""
    results = {}
    for seed, (name, (layout, b, nq, nkv, s1, s2, d, extra)) in enumerate(CASES.items()):
        for dtype in DTYPES:
            gen = torch.Generator().manual_seed(seed)
            q, k, v, kw = _inputs(layout, b, nq, nkv, s1, s2, d, extra, dtype, gen)
            q, k, v = q.to(device), k.to(device), v.to(device)
            kw = {key: val.to(device) if isinstance(val, torch.Tensor) else val
                  for key, val in kw.items()}
            for algorithm in algorithms:
                key = f"{name}/{str(dtype)[6:]}/{algorithm}"
                try:
                    out, lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm,
                                                        backend=backend, **kw)
                    results[key] = f"{_sha(out)} {_sha(lse)}"
                except (NotImplementedError, ValueError) as error:
                    results[key] = f"refused: {type(error).__name__}: {str(error)[:80]}"
                print(f"{key:55s} {results[key]}", flush=True)
    return results


def compare(a: dict, b: dict) -> list[str]:
    """The keys whose entries differ, or that only one side has."""
    return sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--tuning", nargs="*", default=[],
                        help="Triton tuning switches as name=value (e.g. prefill=triton)")
    parser.add_argument("--out", help="write the digests to this JSON file")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="compare two digest files instead of running")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(path)) for path in args.compare)
        differ = compare(a, b)
        for key in differ:
            print(f"{key}: {a.get(key)} | {b.get(key)}")
        print(f"{len(set(a) | set(b)) - len(differ)} same, {len(differ)} differ")
        return 1 if differ else 0
    scope = contextlib.nullcontext()
    if args.tuning:
        from pasa_npu.fallback.triton import tuning
        switches = dict(item.split("=", 1) for item in args.tuning)
        scope = tuning.using(tuning.Tuning(**switches))
    with scope, torch.no_grad():
        results = digest(args.backend, args.device, args.algorithms)
    if args.out:
        with open(args.out, "w") as file:
            json.dump(results, file, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
