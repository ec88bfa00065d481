"""Sequence parallelism on CPU over gloo: pasa_npu.distributed.ring_attention and PASA inside
yunchang's USP (pasa_npu.integrations.yunchang), 2 and 4 spawned ranks.

Each world runs once (a module fixture); every rank computes all of its cases and saves
them; the tests compare the gathered outputs with the fp64 golden of the whole sequence.

The bound. A ring step is one fused_attention call whose output comes back rounded to fp16
(fused_attention returns the input dtype); the merge then adds the partials in fp32 and rounds
once more. With V zero-mean, a partial over 1/W of the keys is about sqrt(W) times larger
than the full output, weighted 1/W, W of them: its rounding adds an error of the size of the
final rounding, independent of it. So the ring's relative RMSE is at most about sqrt(e1^2 +
e_round^2) <= sqrt(2) e1 (e1: the single-process result's own error, at least one fp16
rounding); PASA's per-chunk statistics restart, but each chunk's PASA error scales the same
way, so it adds nothing in expectation. We allow 1.5 x e1: sqrt(2) = 1.41 plus 6% for the
spread of a finite sample. fa-fp32 sits near sqrt(2) (its e1 is one rounding); pasa and
pasa-exact near 1 (their e1 is many roundings).
"""
from __future__ import annotations

import math
import multiprocessing.connection
import os
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

import pasa_npu

FACTOR = 1.5
TIMEOUT_S = 120
_LAST_PROCS: list = []  # the last world's processes, for the harness's own test
D = 64
NQ, NKV = 4, 2  # GQA 2:1


# ----------------------------------------------------------------------------- inputs

def _inputs(case: dict):
    """The whole sequence, (B, S, N, D) (BSND), fp16, deterministic per case."""
    gen = torch.Generator().manual_seed(case["seed"])
    s, nq, nkv, d = case["s"], case.get("nq", NQ), case.get("nkv", NKV), case.get("d", D)
    if case.get("x0"):  # the paper's uniform inputs (eq. 17): Q, K, V ~ U(x0 - 0.5, x0 + 0.5)
        def u(n):
            return ((torch.rand(1, s, n, d, generator=gen, dtype=torch.float64) * 2 - 1) * 0.5
                    + case["x0"]).half()
        return u(nq), u(nkv), u(nkv)
    return (torch.randn(1, s, nq, d, generator=gen).half(),
            torch.randn(1, s, nkv, d, generator=gen).half(),
            torch.randn(1, s, nkv, d, generator=gen).half())


def _band(case):
    if case.get("band"):
        pre, nxt = case["band"]
        return dict(sparse_mode=4, pre_tokens=pre, next_tokens=nxt,
                    atten_mask=pasa_npu.compressed_causal_mask())
    return dict(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask()) \
        if case["causal"] else {}


def _to_layout(x, layout):
    if layout == "BNSD":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.flatten(2)
    return x


def _from_layout(x, layout, heads):
    if layout == "BNSD":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.unflatten(2, (heads, -1))
    return x


def _shards(case, world):
    lens = case.get("lens") or [case["s"] // world] * world
    assert sum(lens) == case["s"]
    return lens, [sum(lens[:i]) for i in range(world)]


def _cases(world: int) -> dict:
    s = {2: 600, 4: 1000}[world]  # shards of 300 / 250: not multiples of kv_block (128)
    cases = {}
    for algorithm in ("pasa", "pasa-mixed", "pasa-exact", "fa-fp32"):
        for causal in (False, True):
            cases[f"{algorithm}-{'causal' if causal else 'full'}"] = dict(
                kind="ring", s=s, algorithm=algorithm, causal=causal, seed=len(cases),
                layout=("BSND", "BNSD", "BSH")[len(cases) % 3])
    if world == 2:
        # a sliding window: steps whose band leaves rows without keys (LSE +inf rows)
        cases["pasa-exact-window"] = dict(kind="ring", s=s, algorithm="pasa-exact", causal=True,
                                          band=(200, 0), seed=11, layout="BSND")
        # a band that leaves the last rows of the sequence without keys (0, LSE +inf)
        cases["fa-fp32-band-empty-rows"] = dict(kind="ring", s=s, algorithm="fa-fp32",
                                                causal=True, band=(-10, 50), seed=14,
                                                layout="BNSD")
        # a one-token shard in a band: that step is fused_attention's decode, which takes no
        # band (the ring attends the band's keys only); the shard last, then first
        cases["fa-fp32-band-one-token-last"] = dict(kind="ring", s=101, algorithm="fa-fp32",
                                                    causal=True, band=(64, 0), lens=[100, 1],
                                                    seed=17, layout="BSND")
        cases["pasa-band-one-token-first"] = dict(kind="ring", s=101, algorithm="pasa",
                                                  causal=True, band=(8, 40), lens=[1, 100],
                                                  seed=18, layout="BNSD")
        # unequal shards (seq_lens)
        cases["fa-fp32-unequal"] = dict(kind="ring", s=s, algorithm="fa-fp32", causal=True,
                                        lens=[344, 256], seed=12, layout="BSND")
        # the paper's overflow: Q, K ~ U(29.5, 30.5), D = 128: |QK| ~ 1.15e5 > fp16's 65504
        for algorithm in ("pasa", "fa-fp16s"):
            cases[f"resonance-{algorithm}"] = dict(
                kind="ring", s=s, algorithm=algorithm, causal=True, x0=30.0, d=128, nq=2,
                nkv=2, seed=13, layout="BSND")
    else:
        # a ring over the process group of ranks {1, 3} (group rank != global rank)
        cases["pasa-exact-subgroup"] = dict(kind="subgroup", s=600, algorithm="pasa-exact",
                                            causal=True, seed=15, layout="BSND")
        # yunchang's UlyssesAttention over the Ulysses group of ranks {0, 1} (and {2, 3})
        cases["yunchang-ulysses-pasa-causal"] = dict(kind="ulysses", s=600, algorithm="pasa",
                                                     causal=True, seed=16, layout="BSND")
        # a sliding window through Ulysses alone (a ring of more than one rank refuses it)
        cases["yunchang-ulysses-fa-fp32-window"] = dict(kind="ulysses", s=600, algorithm="fa-fp32",
                                                        causal=True, band=(50, 0), seed=19,
                                                        layout="BSND")
        for causal in (False, True):  # USP: Ulysses 2 x ring 2 through yunchang
            cases[f"yunchang-usp-pasa-exact-{'causal' if causal else 'full'}"] = dict(
                kind="yunchang", s=s, algorithm="pasa-exact", causal=causal, seed=20 + causal,
                layout="BSND")
        for i, algorithm in enumerate(("pasa", "pasa-mixed", "fa-fp32")):  # every allocation
            cases[f"yunchang-usp-{algorithm}-causal"] = dict(
                kind="yunchang", s=s, algorithm=algorithm, causal=True, seed=22 + i, layout="BSND")
    return cases


# ----------------------------------------------------------------------------- ranks

def _worker(rank: int, world: int, init_file: str, out_dir: str, job: str) -> None:
    try:
        torch.set_num_threads(1)
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
        from pasa_npu.distributed import ring_attention
        if job == "planted-failure":  # rank 0 fails, rank 1 hangs
            if rank == 0:
                raise RuntimeError("planted failure")
            time.sleep(3600)
        if job == "planted-hang":
            time.sleep(3600)
        if world == 4:  # yunchang's USP: Ulysses groups {0, 1}, {2, 3}; rings {0, 2}, {1, 3}
            import yunchang
            yunchang.set_seq_parallel_pg(2, world // 2, rank, world)
        results = {"refusals": _refusals(rank, world)}
        for name, case in _cases(world).items():
            q, k, v = _inputs(case)
            scale = q.shape[-1] ** -0.5
            if case["kind"] in ("ring", "subgroup"):
                group, group_rank, group_size = None, rank, world
                if case["kind"] == "subgroup":
                    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
                    group, group_rank, group_size = groups[rank % 2], rank // 2, 2
                lens, offsets = _shards(case, group_size)
                part = slice(offsets[group_rank], offsets[group_rank] + lens[group_rank])
                lq, lk, lv = (_to_layout(x[:, part], case["layout"]) for x in (q, k, v))
                band = _band(case)
                out, lse = ring_attention(
                    lq, lk, lv, num_heads=q.shape[2], num_key_value_heads=k.shape[2],
                    input_layout=case["layout"], scale=scale, algorithm=case["algorithm"],
                    seq_lens=case.get("lens"), group=group, **band)
                results[name] = (_from_layout(out, case["layout"], q.shape[2]), lse)
            else:
                from yunchang.globals import PROCESS_GROUP
                from pasa_npu.integrations import yunchang as adapter
                if case["kind"] == "ulysses":
                    module = adapter.ulysses_attention(PROCESS_GROUP.ULYSSES_PG,
                                                       algorithm=case["algorithm"])
                    part = slice(rank % 2 * case["s"] // 2, (rank % 2 + 1) * case["s"] // 2)
                else:
                    module = adapter.long_context_attention(algorithm=case["algorithm"])
                    part = slice(rank * case["s"] // world, (rank + 1) * case["s"] // world)
                window = {"window_size": case["band"]} if case.get("band") else {}
                out = module(q[:, part], k[:, part], v[:, part], softmax_scale=scale,
                             causal=case["causal"], **window)
                results[name] = (out, None)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise SystemExit(1)


def _refusals(rank: int, world: int) -> dict:
    """{name: "Type: message"} of calls every rank makes with arguments that disagree across
    the ranks (world 2), or that yunchang's USP cannot serve (world 4)."""
    import torch.distributed as dist
    from pasa_npu.distributed import ring_attention

    def shard(length=8, heads=2, dim=64, batch=1, dtype=torch.float16):
        return torch.randn(batch, length, heads, dim).to(dtype)

    def ring(q, k=None, v=None, **kw):
        kw = dict(dict(num_heads=2, input_layout="BSND", scale=0.125, algorithm="fa-fp32"), **kw)
        return ring_attention(q, q if k is None else k, q if v is None else v, **kw)

    if world == 2:
        other = rank == 1
        rank0_only = dist.new_group([0])
        calls = {
            "dtype": lambda: ring(shard(dtype=torch.bfloat16 if other else torch.float16)),
            "batch": lambda: ring(shard(batch=1 + other)),
            "value head dim": lambda: ring(shard(), v=shard(dim=32 if other else 64)),
            "num_heads": lambda: ring(shard().flatten(2), input_layout="BSH",
                                      num_heads=4 if other else 2),
            "band": lambda: ring(shard(), sparse_mode=0 if other else 3),
            "lengths without seq_lens": lambda: ring(shard(4 if other else 12)),
            "seq_lens differ": lambda: ring(shard(4 if other else 12),
                                            seq_lens=[10, 4] if other else [12, 4]),
            "seq_lens against the shards": lambda: ring(shard(), seq_lens=[8, 7]),
            "not a member": lambda: ring(shard(), group=rank0_only) if other else "skipped",
            "algorithm on rank 1": lambda: ring(shard(), algorithm="bogus" if other else "pasa"),
            "dims on rank 1": lambda: ring(shard().flatten(2) if other else shard()),
            "no tensor on rank 1": lambda: ring(None, [], []) if other else ring(shard()),
            "scale on both": lambda: ring(shard(), scale=-1.0),
        }
    else:
        from yunchang.globals import PROCESS_GROUP
        from pasa_npu.integrations import yunchang as adapter
        usp = adapter.long_context_attention(algorithm="fa-fp32")
        ulysses = adapter.ulysses_attention(PROCESS_GROUP.ULYSSES_PG, algorithm="fa-fp32")
        q = shard(heads=4)
        calls = {
            "window over a ring": lambda: usp(q, q, q, causal=True, window_size=(50, 0)),
            "one KV head, Ulysses 2": lambda: usp(q, q[:, :, :1], q[:, :, :1], causal=True),
            "three query heads, Ulysses 2": lambda: ulysses(q[:, :, :3], q, q),
        }
    found = {}
    for name, call in calls.items():
        try:
            found[name] = f"returned {type(call()).__name__}"
        except Exception as error:
            found[name] = f"{type(error).__name__}: {error}"
    return found


def _run_world(world: int, tmp_path, job: str = "cases", timeout: float = TIMEOUT_S) -> dict:
    """Spawn ``world`` ranks; every rank that fails or outlives ``timeout`` is reported, and
    none is left running: once one rank has failed, the others (which would wait for it
    until the timeout) are stopped at once."""
    ctx = mp.get_context("spawn")
    init_file = str(tmp_path / "init")
    procs = [ctx.Process(target=_worker, args=(r, world, init_file, str(tmp_path), job),
                         daemon=True) for r in range(world)]
    _LAST_PROCS[:] = procs
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    failed = False
    while not failed and time.monotonic() < deadline:
        alive = [p for p in procs if p.is_alive()]
        if not alive:
            break
        multiprocessing.connection.wait([p.sentinel for p in alive],
                                        min(1.0, max(0.0, deadline - time.monotonic())))
        failed = any(p.exitcode not in (None, 0) for p in procs)
    stopped = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)
    problems = [f"rank {r} stopped after another rank failed" if failed else
                f"rank {r} hung past {timeout} s (terminated)" for r in stopped]
    for r, p in enumerate(procs):
        err = tmp_path / f"rank{r}.err"
        if err.exists():
            problems.append(f"rank {r} failed:\n{err.read_text()}")
        elif r not in stopped and p.exitcode != 0:
            problems.append(f"rank {r} exited with {p.exitcode}")
    if problems:
        pytest.fail("\n".join(problems))
    return {r: torch.load(tmp_path / f"rank{r}.pt") for r in range(world)}


@pytest.fixture(scope="module")
def ring2(tmp_path_factory):
    return _run_world(2, tmp_path_factory.mktemp("ring2"))


@pytest.fixture(scope="module")
def ring4(tmp_path_factory):
    return _run_world(4, tmp_path_factory.mktemp("ring4"))


# ----------------------------------------------------------------------------- checks

def _gathered(results, name, world):
    ranks = {"subgroup": [1, 3], "ulysses": [0, 1]}.get(_cases(world)[name]["kind"],
                                                         range(world))
    outs = [results[r][name][0] for r in ranks]
    lses = [results[r][name][1] for r in ranks]
    lse = None if lses[0] is None else torch.cat(lses, dim=2)
    return torch.cat(outs, dim=1), lse


def _single(case):
    """(single-process fused_attention, fp64 golden), both (B, S, N, D), and the LSEs."""
    q, k, v = _inputs(case)
    args = dict(num_heads=q.shape[2], num_key_value_heads=k.shape[2], input_layout="BSND",
                scale=q.shape[-1] ** -0.5, softmax_lse_flag=True, **_band(case))
    out, lse = pasa_npu.fused_attention(q, k, v, algorithm=case["algorithm"], **args)
    gold, gold_lse = pasa_npu.reference_attention(q, k, v, **args)
    return out, lse, gold, gold_lse


def _rel_rmse(x, gold):
    return ((x.double() - gold).norm() / gold.norm()).item()


def _check(results, world, name):
    case = _cases(world)[name]
    out, lse = _gathered(results, name, world)
    single, single_lse, gold, gold_lse = _single(case)
    assert out.shape == gold.shape and out.dtype == torch.float16
    e_ring, e_single = _rel_rmse(out, gold), _rel_rmse(single, gold)
    print(f"{name} over {world}: ring {e_ring:.3e}, single process {e_single:.3e}, "
          f"ratio {e_ring / e_single:.3f}")
    assert math.isfinite(e_ring), f"{name}: the ring's output is not finite"
    assert e_ring <= FACTOR * e_single, (name, e_ring, e_single)
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == single_lse.shape
        finite = torch.isfinite(gold_lse)
        # empty rows: fused_attention's convention, kept by the ring
        assert torch.equal(torch.isinf(lse), torch.isinf(single_lse))
        # the LSE: the same factor over the single process's largest error, plus the merge's
        # own fp32 roundings (a few ulps of the LSE)
        l_ring = (lse[finite].double() - gold_lse[finite]).abs().max().item()
        l_single = (single_lse[finite].double() - gold_lse[finite]).abs().max().item()
        ulps = 4 * 2.0 ** -23 * gold_lse[finite].abs().max().item()
        print(f"  LSE max abs error: ring {l_ring:.3e}, single process {l_single:.3e}")
        assert l_ring <= FACTOR * l_single + ulps, (name, l_ring, l_single)


@pytest.mark.parametrize("name", [n for n in _cases(2) if not n.startswith("resonance")])
def test_ring_two_ranks(ring2, name):
    _check(ring2, 2, name)


@pytest.mark.parametrize("name", list(_cases(4)))
def test_ring_four_ranks(ring4, name):
    _check(ring4, 4, name)


def test_ring_resonance_fp16_scores_overflow_pasa_does_not(ring2):
    bad, _ = _gathered(ring2, "resonance-fa-fp16s", 2)
    assert bad.isnan().float().mean().item() > 0.5, "fp16 scores were expected to overflow"
    _check(ring2, 2, "resonance-pasa")


def test_merge_partial_empty_and_overflowed_rows():
    from pasa_npu.distributed import merge_partial
    out = torch.ones(1, 1, 3, 2)
    lse = torch.tensor([0.0, 0.0, float("-inf")]).view(1, 1, 3, 1)
    block = torch.tensor([[2.0, 2.0], [0.0, 0.0], [3.0, 3.0]]).view(1, 1, 3, 2)
    block_lse = torch.tensor([0.0, float("inf"), 1.0]).view(1, 1, 3, 1)
    merged, merged_lse = merge_partial(out, lse, block, block_lse)
    assert torch.allclose(merged[0, 0], torch.tensor([[1.5, 1.5], [1.0, 1.0], [3.0, 3.0]]))
    assert torch.allclose(merged_lse.flatten(), torch.tensor([math.log(2), 0.0, 1.0]))
    overflowed = torch.tensor([float("inf")]).view(1, 1, 1, 1)
    nan, _ = merge_partial(out[:, :, :1], lse[:, :, :1], block[:, :, :1], overflowed)
    assert nan.isnan().all()


#: what a refusal of ranks that disagree must name, on every rank: the argument, rank 0's
#: value and the other rank's
_DISAGREEMENTS = {
    "dtype": ("on dtype", "rank 0 has torch.float16", "rank 1 has torch.bfloat16"),
    "batch": ("on query's shape", "rank 0 has (1, 2, 64)", "rank 1 has (2, 2, 64)"),
    "value head dim": ("on value's shape", "rank 0 has (1, 2, 64)", "rank 1 has (1, 2, 32)"),
    "num_heads": ("on num_heads", "rank 0 has 2", "rank 1 has 4"),
    "band": ("on sparse_mode, pre_tokens, next_tokens", "rank 0 has [3, 2147483647, 0]",
             "rank 1 has [0, 2147483647, 2147483647]"),
    "lengths without seq_lens": ("seq_lens is None", "pass seq_lens=[12, 4]"),
    "seq_lens differ": ("on seq_lens", "rank 0 has [12, 4]", "rank 1 has [10, 4]"),
    "seq_lens against the shards": ("seq_lens [8, 7] does not match", "lengths [8, 8]"),
}


@pytest.mark.parametrize("name", list(_DISAGREEMENTS))
def test_ring_refuses_ranks_that_disagree(ring2, name):
    """Refused on every rank before any K/V moves (the cases the world runs next pass)."""
    messages = [ring2[rank]["refusals"][name] for rank in range(2)]
    assert messages[0] == messages[1] and messages[0].startswith("ValueError: "), messages
    for part in _DISAGREEMENTS[name]:
        assert part in messages[0], messages[0]


#: a rank that refuses its own arguments: its own error there (the start of it), and the
#: other rank's, which names it; "both": every rank refuses with its own error
_OWN_REFUSALS = {
    "algorithm on rank 1": "ValueError: algorithm must be one of (",
    "dims on rank 1": "ValueError: query must have 4 dims (BSND), got shape (1, 8, 128)",
    "no tensor on rank 1": "TypeError: query must be a torch.Tensor, got None",
    "scale on both": "ValueError: scale must be finite and positive, got -1.0",
}


@pytest.mark.parametrize("name", list(_OWN_REFUSALS))
def test_ring_refusal_of_one_rank_reaches_every_rank(ring2, name):
    """A rank whose own checks (fused_attention's for its first step included) refuse its
    call raises its own error, and the others raise one naming it, all before any K/V is
    sent (the cases the world runs next pass, so no send was left pending)."""
    rank0, rank1 = (ring2[rank]["refusals"][name] for rank in range(2))
    assert rank1.startswith(_OWN_REFUSALS[name]), rank1
    if name.endswith("both"):
        assert rank0 == rank1
    else:
        assert rank0 == ("ValueError: ring_attention: rank 1 of group refused its arguments "
                         "(the error is raised there); no K/V was sent")


def test_ring_refuses_a_rank_outside_group(ring2):
    assert ring2[1]["refusals"]["not a member"] == (
        "ValueError: this process is not a member of group: ring_attention runs on the ranks "
        "of group only")


def test_yunchang_refusals_before_communicating(ring4):
    """Every rank of USP (Ulysses 2 x ring 2) refuses what it cannot serve; the cases the world
    runs next pass."""
    for rank in range(4):
        found = ring4[rank]["refusals"]
        assert found["window over a ring"].startswith(
            "NotImplementedError: window_size (50, 0) over a ring of 2 ranks"), found
        assert found["one KV head, Ulysses 2"].startswith(
            "ValueError: key has 1 heads, which the Ulysses degree 2 does not divide"), found
        assert found["three query heads, Ulysses 2"].startswith(
            "ValueError: query has 3 heads, which the Ulysses degree 2 does not divide"), found


@pytest.fixture
def world1(tmp_path):
    """A gloo group of this process alone."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1, timeout=timedelta(seconds=TIMEOUT_S))
    yield
    dist.destroy_process_group()


_SMALL = dict(num_heads=2, input_layout="BSND", scale=0.125, algorithm="fa-fp32")


def _small(dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 16, 2, 64, generator=gen).to(dtype) for _ in range(3)]


def _too_early(*args, **kwargs):
    raise AssertionError("reached before the arguments were checked")


@pytest.mark.parametrize("change, error, message", [
    (dict(query=[[1.0]]), TypeError, "query must be a torch.Tensor, got [[1.0]]"),
    (dict(query=None), TypeError, "query must be a torch.Tensor, got None"),
    (dict(key="fp32"), TypeError, "key must be float16 or bfloat16, got torch.float32"),
    (dict(query="int"), TypeError, "query must be float16 or bfloat16, got torch.int32"),
    (dict(atten_mask="causal", sparse_mode=3), TypeError,
     "atten_mask must be a tensor or None, got 'causal'"),
    (dict(value="grad"), NotImplementedError,
     "ring_attention is forward only (no backward): run it under torch.no_grad() or "
     "torch.inference_mode()"),
    (dict(algorithm="bogus"), ValueError, "algorithm must be one of ('fa-fp32', 'fa-fp16s', "
     "'fa-fp16', 'pasa', 'pasa-mixed', 'pasa-exact') or None, got 'bogus'"),
    (dict(sparse_mode=3, scale=0.0), ValueError, "scale must be finite and positive, got 0.0"),
])
def test_ring_checks_inputs_before_communicating(world1, monkeypatch, change, error, message):
    """Refused before any K/V moves or any step runs: only the all_gather that shares the
    refusal with the group is reached (on key's device where query is not a tensor)."""
    import pasa_npu.distributed
    q, k, v = _small()
    tensors = dict(query=q, key=k, value=v)
    change = dict(change)
    for name, how in change.items():
        if name in tensors and how in ("fp32", "int", "grad"):
            change[name] = {"fp32": tensors[name].float(), "int": tensors[name].int(),
                            "grad": tensors[name].clone().requires_grad_()}[how]
    gathered = []
    all_gather = torch.distributed.all_gather
    monkeypatch.setattr(torch.distributed, "all_gather",
                        lambda *a, **kw: gathered.append(a) or all_gather(*a, **kw))
    monkeypatch.setattr(torch.distributed, "batch_isend_irecv", _too_early)
    monkeypatch.setattr(pasa_npu.distributed, "fused_attention", _too_early)
    with pytest.raises(error) as refused:
        pasa_npu.distributed.ring_attention(**dict(tensors, **dict(_SMALL, **change)))
    assert str(refused.value) == message
    assert len(gathered) == 1


def test_ring_refusal_without_a_device_raises_alone(world1, monkeypatch):
    """A rank with no tensor gathers on the CPU where the backend carries it (a gloo group,
    and a subgroup whose backend is given as "cpu:gloo"); on a backend that carries neither
    the CPU nor this machine's accelerator it has nothing to all_gather on, and raises its
    own error without communicating."""
    import torch.distributed as dist
    from pasa_npu.distributed import ring_attention
    gathered = []
    all_gather = dist.all_gather
    monkeypatch.setattr(dist, "all_gather",
                        lambda *a, **kw: gathered.append(a[1].device) or all_gather(*a, **kw))
    for group in (None, dist.new_group([0], backend="cpu:gloo")):
        with pytest.raises(TypeError, match="query must be a torch.Tensor, got None"):
            ring_attention(None, None, None, group=group, **_SMALL)
    assert gathered == [torch.device("cpu")] * 2
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "npu:hccl")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    with pytest.raises(TypeError, match="query must be a torch.Tensor, got None"):
        ring_attention(None, None, None, **_SMALL)
    assert gathered == [torch.device("cpu")] * 2


def test_ring_refuses_a_query_on_a_device_the_backend_does_not_carry(world1, monkeypatch):
    """CPU shards on a group whose backend carries CUDA tensors only (NCCL) are refused by
    name, before any K/V moves (the refusal is shared on the GPU: the GPU test)."""
    import torch.distributed as dist
    from pasa_npu.distributed import ring_attention
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "cuda:nccl")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(dist, "batch_isend_irecv", _too_early)
    with pytest.raises(ValueError) as refused:
        ring_attention(*_small(), **_SMALL)
    assert str(refused.value) == ("query is on cpu, but the backend of group (cuda:nccl) "
                                  "carries cuda tensors only")


@pytest.mark.parametrize("change", [
    dict(sparse_mode=3.9), dict(sparse_mode="3"), dict(sparse_mode=4, pre_tokens=2.5),
    dict(sparse_mode=4, pre_tokens=4, next_tokens=True),
    dict(sparse_mode=3, atten_mask=torch.zeros(2048, 2048, dtype=torch.bool)),
    dict(sparse_mode=4, pre_tokens=4, next_tokens=0, atten_mask=torch.zeros(2048, 2048)),
], ids=str)
def test_ring_checks_arguments_as_fused_attention(world1, change):
    from pasa_npu.distributed import ring_attention
    q, k, v = _small()
    fused_args = dict(dict(atten_mask=pasa_npu.compressed_causal_mask()), **change)
    with pytest.raises((TypeError, ValueError)) as fused:
        pasa_npu.fused_attention(q, k, v, **_SMALL, **fused_args)
    with pytest.raises(type(fused.value)) as ring:
        ring_attention(q, k, v, **_SMALL, **change)
    assert str(ring.value) == str(fused.value)


def test_ring_runs_inputs_that_require_grad_under_no_grad(world1):
    from pasa_npu.distributed import ring_attention
    q, k, v = _small()
    with torch.no_grad():
        out, _ = ring_attention(q.requires_grad_(), k, v, **_SMALL, sparse_mode=3,
                                atten_mask=pasa_npu.compressed_causal_mask())
    assert not out.requires_grad


def test_ring_validates_each_step_once(world1, monkeypatch):
    """The plan that checks a one-rank ring's arguments runs its step: the call is bound
    (validated) once, with the result of one fused_attention call."""
    import pasa_npu.arguments
    from pasa_npu.distributed import ring_attention
    q, k, v = _small()
    causal = dict(_SMALL, sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())
    expected = pasa_npu.fused_attention(q, k, v, **causal, softmax_lse_flag=True)
    bound = []
    bind = pasa_npu.arguments.bind
    monkeypatch.setattr(pasa_npu.arguments, "bind",
                        lambda *a, **kw: bound.append(a[0]) or bind(*a, **kw))
    out, lse = ring_attention(q, k, v, **causal)
    assert bound == ["plan"]
    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, expected[1], rtol=0, atol=0)


def test_merge_partial_checks_shapes():
    from pasa_npu.distributed import merge_partial
    out, lse = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 1)
    with pytest.raises(ValueError, match=r"block_lse \(B, N, S, 1\); got \(1, 2, 8, 4\) and "
                                         r"\(1, 2, 8\)"):
        merge_partial(None, None, out, lse[..., 0])  # flash-attn's (B, N, S) LSE
    with pytest.raises(ValueError, match=r"out \(1, 2, 8, 4\) and lse \(1, 2, 8, 1\) must "
                                         r"have the shapes of block_out \(1, 2, 4, 4\)"):
        merge_partial(out, lse, out[:, :, :4], lse[:, :, :4])
    with pytest.raises(ValueError, match=r"out and lse both None \(no block merged yet\) or both "
                                         r"tensors; got out=a tensor of shape \(1, 2, 8, 4\) and "
                                         r"dtype torch.float32 and lse=None"):
        merge_partial(out, None, out, lse)


def test_yunchang_on_one_rank(world1):
    """The rings that forward attn_processor give one fused_attention call's result (a window
    too, on a ring of one rank); unknown rings, gradients and the attention probabilities are
    refused, naming them."""
    import yunchang
    from pasa_npu.integrations import yunchang as adapter
    yunchang.set_seq_parallel_pg(1, 1, 0, 1)
    with pytest.raises(ValueError, match=r"unknown ring_impl_type 'nonsense'; yunchang's are \[.*"
                                         r"'zigzag'\], of which \['basic', 'basic_flashinfer'\]"):
        adapter.long_context_attention("nonsense")
    with pytest.raises(NotImplementedError, match="'zigzag' ring does not forward a custom "
                                                  "attention .* 'basic_flashinfer'"):
        adapter.long_context_attention("zigzag")
    q, k, v = _small()
    mask = pasa_npu.compressed_causal_mask()
    for ring, window, band in (("basic_flashinfer", (-1, -1), dict(sparse_mode=3)),
                               ("basic", (5, 0), dict(sparse_mode=4, pre_tokens=5, next_tokens=0))):
        module = adapter.long_context_attention(ring, algorithm="fa-fp32")
        out = module(q, k, v, softmax_scale=0.125, causal=True, window_size=window)
        want, _ = pasa_npu.fused_attention(q, k, v, atten_mask=mask, **_SMALL, **band)
        torch.testing.assert_close(out, want, msg=ring)
    with pytest.raises(NotImplementedError, match=r"forward only .* torch\.no_grad\(\)"):
        module(q.clone().requires_grad_(), k, v, causal=True)
    with pytest.raises(NotImplementedError, match="return_attn_probs"):
        module(q, k, v, causal=True, return_attn_probs=True)
    with pytest.raises(NotImplementedError, match="return_softmax"):
        adapter.pasa_flash_attn_forward(q, k, v, return_softmax=True)


def test_failed_rank_is_reported_and_hung_rank_terminated(tmp_path):
    # 60 s: under a loaded machine (every core running tests) a spawned rank takes several
    # seconds to import torch before it can fail; the hung rank is stopped once it has
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        _run_world(2, tmp_path, job="planted-failure", timeout=60)
    message = str(failure.value)
    assert "rank 0 failed" in message and "planted failure" in message
    assert "rank 1 stopped after another rank failed" in message
    assert len(_LAST_PROCS) == 2 and not any(p.is_alive() for p in _LAST_PROCS)
    assert time.monotonic() - started < 60


def test_hung_rank_is_terminated_at_the_timeout(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failure:
        _run_world(1, tmp_path, job="planted-hang", timeout=3)
    assert "rank 0 hung past 3 s (terminated)" in str(failure.value)
    assert not any(p.is_alive() for p in _LAST_PROCS)


def test_example_ring_attention_overflow():
    """examples/ring_attention.py, 2 ranks, a sequence they do not divide: fp16 scores all NaN,
    PASA finite and accurate."""
    import signal
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "examples" / "ring_attention.py"
    proc = subprocess.Popen([sys.executable, str(script), "--seq", "601", "--world", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the example and the ranks it spawned
        proc.communicate()
        pytest.fail(f"examples/ring_attention.py ran past {TIMEOUT_S} s (killed)")
    assert proc.returncode == 0, output
    lines = {line.split(":")[0].strip(): line for line in output.splitlines() if ":" in line}
    assert "S=601 over 2 ranks (300 or 301 tokens each)" in output, output
    assert "NaN 100%" in lines["fa-fp16s"], output
    for name in ("pasa", "pasa-exact"):
        assert "NaN 0%" in lines[name], output
        assert float(lines[name].split("fp64")[1].split(",")[0]) < 1e-2, output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL, CUDA tensors)")
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_gpu_single_rank_group_equals_one_call(backend, tmp_path):
    """On one GPU: the ring over a one-rank group (NCCL, or gloo with CUDA tensors) and
    yunchang's USP with PASA (NCCL) give single-process fused_attention's result, on the
    Triton backend, for every case of the two-rank matrix that runs the ring; a call with no
    tensor is refused after sharing the refusal on the backend's device."""
    import torch.distributed as dist
    from pasa_npu.distributed import ring_attention
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1, timeout=timedelta(seconds=TIMEOUT_S))
    try:
        for name, case in _cases(2).items():
            if case["kind"] != "ring":
                continue
            q, k, v = (x.cuda() for x in _inputs(case))
            kw = dict(num_heads=q.shape[2], num_key_value_heads=k.shape[2], scale=q.shape[-1] ** -0.5,
                      algorithm=case["algorithm"], backend="triton", **_band(case))
            if "atten_mask" in kw:
                kw["atten_mask"] = kw["atten_mask"].cuda()
            out, lse = ring_attention(q, k, v, input_layout="BSND", **kw)
            want, want_lse = pasa_npu.fused_attention(q, k, v, input_layout="BSND", softmax_lse_flag=True, **kw)
            for got, expected in ((out, want), (lse, want_lse)):  # bit for bit, NaN rows too
                torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=name)
        with pytest.raises(TypeError, match="query must be a torch.Tensor, got None"):
            ring_attention(None, None, None)  # its refusal shared on the backend's device
        if backend == "nccl":
            with pytest.raises(ValueError, match="query is on cpu, but the backend of group "
                                                 r"\(cuda:nccl\) carries cuda tensors only"):
                ring_attention(*_small(), **_SMALL)  # shared on the current CUDA device
        if backend == "nccl":
            import yunchang
            from pasa_npu.integrations import yunchang as adapter
            yunchang.set_seq_parallel_pg(1, 1, 0, 1)
            case = _cases(4)["yunchang-usp-pasa-exact-causal"]
            q, k, v = (x.cuda() for x in _inputs(case))
            module = adapter.long_context_attention(algorithm=case["algorithm"], backend="triton")
            out = module(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=True).cpu()
            single, _, gold, _ = _single(case)
            assert _rel_rmse(out, gold) <= FACTOR * _rel_rmse(single, gold)
    finally:
        dist.destroy_process_group()
