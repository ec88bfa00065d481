"""The Triton backend's host side in a serving loop: decode steps whose
actual_seq_lengths_kv grow by one token each never wait for the GPU, a copy of new
lengths is safe on every stream, and a CUDA graph captured on lengths never seen
before replays them correctly. A repeated call launches its kernels without Triton's
per-call argument binding, and computes the same; a plan's later calls repeat the launches
its first call recorded (decode and prefill) on their own tensors, bit for bit as unbound.
With host lengths, every argument form runs without a synchronisation once its plan
exists."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import BACKENDS, op_defaults
from _bounds import assert_triton_matches_cpu, triton_numerics

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU (stream synchronisation, CUDA graphs)")

HEADS, KV_HEADS, D, CAPACITY = 8, 2, 128, 1000


def _cache(device):
    gen = torch.Generator(device=device).manual_seed(5)
    q = torch.randn(2, HEADS, 1, D, device=device, generator=gen).half()
    k, v = (torch.randn(2, KV_HEADS, CAPACITY, D, device=device, generator=gen).half()
            for _ in range(2))
    return q, k, v


def _keywords(lens):
    return dict(num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BNSD",
                scale=D ** -0.5, actual_seq_lengths_kv=lens, softmax_lse_flag=True)


def _step(q, k, v, lens, algorithm, backend="triton"):
    return pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend=backend,
                                    **_keywords(lens))


def _metadata(q_lens, kv_lens, band=None):
    from types import SimpleNamespace

    from pasa_npu.fallback.triton import metadata as triton_metadata

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    problem = SimpleNamespace(q_starts=t([0] * len(q_lens)), q_lens=t(q_lens),
                              kv_starts=t([0] * len(q_lens)), kv_lens=t(kv_lens),
                              band=band and tuple(t(x) for x in band))
    return triton_metadata.device_metadata(problem, dev)


def test_a_compiled_call_keeps_no_device_tensor_in_the_caches():
    """The compiled operator's call (``keeping_nothing``) makes the Triton backend's cached
    device tensors (placeholders, pasa's shift table, the per-batch metadata, the optimized
    mask's reference) for itself and keeps none: under mode="reduce-overhead" they would
    sit in a CUDA graph's memory pool, which must hold only the graph's outputs. The same
    call made eagerly fills the caches, and computes the same."""
    from pasa_npu import masks
    from pasa_npu.fallback import kernel_common
    from pasa_npu.fallback.triton import metadata, shift

    def cached():
        return (kernel_common.placeholder.cache_info().currsize,
                shift.cached_shift_table.cache_info().currsize,
                len(metadata._DEVICE_METADATA), masks._reference_mask.cache_info().currsize)

    kernel_common.placeholder.cache_clear()
    shift.cached_shift_table.cache_clear()
    metadata._DEVICE_METADATA.clear()
    masks._reference_mask.cache_clear()
    masks._VALIDATED_MASKS.clear()
    pasa_npu.plans.clear()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen).half().to(dev) for _ in range(3))
    defaults = op_defaults()
    kw = dict(num_heads=2, input_layout="BNSD", scale=32 ** -0.5, algorithm="pasa",
              backend="triton", sparse_mode=3)
    mask = pasa_npu.compressed_causal_mask(dev)
    op = torch.ops.pasa_npu.fused_attention.default
    traced = op(q, k, v, mask, None, None, None, None, None, None, **dict(defaults, **kw))
    assert cached() == (0, 0, 0, 0)
    masks._VALIDATED_MASKS.clear()
    pasa_npu.plans.clear()  # the eager call makes its plan too, validating the mask
    eager = pasa_npu.fused_attention(q, k, v, atten_mask=mask, **kw)
    assert all(n > 0 for n in cached()), cached()
    assert torch.equal(traced[0], eager[0])


def test_device_metadata_is_one_copy_cached_by_value():
    from pasa_npu.fallback.triton.metadata import BAND_LIMIT

    first = _metadata([1, 1], [3, 4])
    assert [r.tolist() for r in first] == [[0, 0], [1, 1], [0, 0], [3, 4], [1, 1], [1, 1]]
    assert all(r.dtype == torch.int32 for r in first)
    assert len({r.untyped_storage().data_ptr() for r in first}) == 1
    again = _metadata([1, 1], [3, 4])  # same values: the cached copy, nothing new
    assert all(a is b for a, b in zip(again, first))
    grown = _metadata([1, 1], [4, 5])
    assert grown[3].tolist() == [4, 5] and first[3].tolist() == [3, 4]
    banded = _metadata([2, 2], [4, 5], band=([2 ** 40, 0], [-(2 ** 40), 1]))
    assert banded[4].tolist() == [BAND_LIMIT, 0] and banded[5].tolist() == [-BAND_LIMIT, 1]
    with pytest.raises(NotImplementedError, match="indexes in int32"):
        _metadata([1], [2 ** 31])


def _check(outs, steps, q, k, v, algorithm):
    qc, kc, vc = (t.cpu() for t in (q, k, v))
    for lens, (out, lse) in zip(steps, outs):
        with triton_numerics("decode"):
            ref, ref_lse = _step(qc, kc, vc, lens, algorithm, backend="torch")
        assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, "growing-lengths",
                                  path="decode", what=f"lengths {lens}",
                                  call=(qc, kc, vc, _keywords(lens)), kv_lens=lens)


@needs_gpu
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_decode_steps_with_growing_lengths_never_wait_for_the_gpu(algorithm):
    q, k, v = _cache("cuda")
    _step(q, k, v, [505, 705], algorithm)  # compiles the kernels these lengths use
    torch.cuda.synchronize()
    steps = [[500 + i, 700 + i] for i in range(1, 5)]
    torch.cuda._sleep(1 << 30)  # about half a second of GPU work queued ahead of the steps
    outs = [_step(q, k, v, lens, algorithm) for lens in steps]
    assert not torch.cuda.current_stream().query(), "a decode step waited for the GPU"
    torch.cuda.synchronize()
    _check(outs, steps, q, k, v, algorithm)


@needs_gpu
def test_lengths_copied_on_one_stream_are_complete_on_another():
    _metadata([1, 1], [3, 4])  # the first pinned allocation may synchronise: not here
    torch.cuda.synchronize()
    for step in range(3):
        kv_lens = [1000 + step, 2000 + step]
        torch.cuda._sleep(1 << 30)  # the copy of the new lengths queues behind this
        _metadata([1, 1], kv_lens)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # the cached copy: this stream must wait for it
            seen = _metadata([1, 1], kv_lens)[3].clone()
        torch.cuda.synchronize()
        assert seen.tolist() == kv_lens, f"read {seen.tolist()} on the other stream"


@needs_gpu
def test_graph_captured_on_new_lengths_replays_them():
    q, k, v = _cache("cuda")
    _step(q, k, v, [300, 400], "pasa-exact")  # compiles; the captured lengths are new
    lens = [321, 487]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a capturing copy of new lengths: the graph re-reads it
        out, lse = _step(q, k, v, lens, "pasa-exact")
    for _ in range(2):  # replays read the lengths the graph captured
        out.zero_()
        graph.replay()
        want, want_lse = _step(q, k, v, lens, "pasa-exact")
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


@needs_gpu
@pytest.mark.parametrize("algorithm", ["pasa", "fa-fp32"])
def test_a_captured_decode_holds_no_fill_of_its_counters(algorithm, monkeypatch):
    """Decode with split kv (each group's splits merged by the last to arrive), captured
    after an eager call: its arrival counters come from ``capture_counters``, so a replay
    runs one kernel fewer than the same call captured without them (their fill); a graph
    of two calls and a second graph take counters of their own; replayed one after the
    other and interleaved, every captured call equals the eager call bit for bit."""
    from torch.profiler import ProfilerActivity, profile

    from pasa_npu.fallback import capture_counters
    q, k, v = _cache("cuda")
    lens = [CAPACITY, 700]
    want = _step(q, k, v, lens, algorithm)
    torch.cuda.synchronize()

    def capture(calls):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results = [_step(q, k, v, lens, algorithm) for _ in range(calls)]
        return graph, results

    def kernels_replayed(graph):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type.name == "CUDA"
                and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]

    graphs, captured = zip(capture(2), capture(1))
    first, second = list(capture_counters._ARENAS.values())[-2:]
    assert first.data_ptr() != second.data_ptr()
    with monkeypatch.context() as patch:
        patch.setattr(capture_counters, "arena", lambda device, need: None)
        filling, _ = capture(1)
    ours, theirs = kernels_replayed(graphs[1]), kernels_replayed(filling)
    assert any("decode_split_kernel" in name for name in ours), ours
    assert len(ours) == len(theirs) - 1, (ours, theirs)
    for i in (0, 1, 1, 0, 0):
        for out, lse in (*captured[0], *captured[1]):
            out.zero_()
            lse.zero_()
        graphs[i].replay()
        torch.cuda.synchronize()
        for out, lse in captured[i]:
            assert torch.equal(out, want[0]) and torch.equal(lse, want[1]), i


def test_launch_key_tells_apart_what_triton_specialises_on():
    from pasa_npu.fallback.kernel_common import _spec

    t = torch.zeros(64, dtype=torch.float16)
    assert _spec(t) == _spec(torch.ones(64, dtype=torch.float16))  # new data, same kernel
    assert _spec(t) != _spec(t[1:])  # no longer 16-byte aligned
    assert _spec(t) != _spec(t.float())
    assert _spec(17) != _spec(16) and _spec(True) != _spec(1)
    assert _spec(0.5) == _spec(2.0)  # a float argument is never specialised on its value


@needs_gpu
@pytest.mark.parametrize("case", ["prefill", "decode"])
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_repeated_calls_launch_the_same_kernels_directly(case, algorithm, monkeypatch):
    """The second call of a shape skips Triton's argument binding for every launch, on new
    tensors, and computes what Triton's own launch path computes, bit for bit (graph
    replays off: the launches themselves)."""
    from pasa_npu.fallback import kernel_common
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", False)

    s1, s2 = (300, 300) if case == "prefill" else (1, 700)
    gen = torch.Generator(device="cuda").manual_seed(7)

    def inputs():
        return (torch.randn(2, HEADS, s1, D, device="cuda", generator=gen).half(),
                *(torch.randn(2, KV_HEADS, s2, D, device="cuda", generator=gen).half()
                  for _ in range(2)))

    def call(q, k, v):
        return pasa_npu.fused_attention(q, k, v, num_heads=HEADS, num_key_value_heads=KV_HEADS,
                                        input_layout="BNSD", scale=D ** -0.5,
                                        algorithm=algorithm, backend="triton",
                                        softmax_lse_flag=True)

    call(*inputs())
    q, k, v = inputs()
    before = kernel_common.FAST_LAUNCHES[0]
    fast = call(q, k, v)
    assert kernel_common.FAST_LAUNCHES[0] > before, "no launch skipped Triton's binding"
    kernel_common._LAUNCHES.clear()  # every launch through kernel[grid] again
    pasa_npu.plans.clear()  # and no launch bound in a plan
    before = kernel_common.FAST_LAUNCHES[0]
    bound = call(q, k, v)
    assert kernel_common.FAST_LAUNCHES[0] == before
    assert all(torch.equal(a, b) for a, b in zip(fast, bound))


def _decode_forms(device):
    """name -> (query shape, key/value shape, keywords, v2) of decode calls: contiguous,
    paged, packed with sinks (a v2 call); with and without the LSE."""
    gen = torch.Generator(device=device).manual_seed(11)
    rand = lambda *shape: torch.randn(*shape, device=device, generator=gen).half()  # noqa: E731
    base = dict(num_heads=HEADS, num_key_value_heads=KV_HEADS, scale=D ** -0.5)
    table = torch.randperm(8, generator=torch.Generator().manual_seed(1)).view(2, 4)
    return {
        "BNSD": ((2, HEADS, 1, D), (2, KV_HEADS, 700, D), dict(base, input_layout="BNSD"),
                 False),
        "BSH lengths, LSE": ((2, 1, HEADS * D), (2, 700, KV_HEADS * D), dict(
            base, input_layout="BSH", actual_seq_lengths_kv=[700, 333],
            softmax_lse_flag=True), False),
        "paged BSH": ((2, 1, HEADS * D), (8, 128, KV_HEADS * D), dict(
            base, input_layout="BSH", block_table=table.to(torch.int32).to(device),
            block_size=128, actual_seq_lengths_kv=[500, 300]), False),
        "v2 TND sinks": ((2, HEADS, D), (900, KV_HEADS, D), dict(
            num_query_heads=HEADS, num_key_value_heads=KV_HEADS, softmax_scale=D ** -0.5,
            input_layout="TND", actual_seq_qlen=[1, 2], actual_seq_kvlen=[600, 900],
            learnable_sink=torch.randn(HEADS, device=device, generator=gen)), True),
    }, rand


def _mask_forms(device):
    """name -> (query shape, key/value shape, keywords, v2) of calls with explicit masks that
    empty rows (the mean of V, or 0 and +inf with ``inner_precise`` bit 1), prefill and
    decode, with ragged lengths."""
    gen = torch.Generator(device=device).manual_seed(7)
    explicit = torch.rand(2, 1, 200, 250, device=device, generator=gen) < 0.5
    explicit[:, :, ::9] = True  # rows the mask empties
    base = dict(num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BNSD",
                scale=D ** -0.5)
    return {
        "prefill explicit mask": ((2, HEADS, 200, D), (2, KV_HEADS, 250, D), dict(
            base, atten_mask=explicit, actual_seq_lengths=[200, 120], softmax_lse_flag=True),
            False),
        "prefill explicit mask, row-invalid": ((2, HEADS, 200, D), (2, KV_HEADS, 250, D), dict(
            base, atten_mask=explicit, actual_seq_lengths=[200, 120],
            actual_seq_lengths_kv=[250, 199], softmax_lse_flag=True, inner_precise=2), False),
        "decode explicit mask": ((2, HEADS, 1, D), (2, KV_HEADS, 700, D), dict(
            base, atten_mask=torch.rand(2, 700, device=device, generator=gen) < 0.5,
            actual_seq_lengths_kv=[700, 333]), False),
    }


def _entries(v2: bool):
    """(the call, its plan) of v1 or v2."""
    if v2:
        return pasa_npu.fused_attention_v2, pasa_npu.plan_v2
    return pasa_npu.fused_attention, pasa_npu.plan


def _gpu_form(form: str, algorithm: str) -> tuple:
    """((the entry point, its plan), the query's and K/V's shapes, the keywords, a random
    fp16 tensor maker) of a decode or prefill ``form`` on the GPU, computed by
    ``algorithm``."""
    forms, rand = _decode_forms("cuda")
    forms.update(_prefill_forms("cuda"))
    q_shape, kv_shape, keywords, v2 = forms[form]
    keywords = dict(keywords, algorithm=algorithm, backend="triton")
    return _entries(v2), q_shape, kv_shape, keywords, rand


def _prefill_forms(device):
    """name -> (query shape, key/value shape, keywords, v2) of prefill calls: on the
    Gluon kernel (full lengths, causal; paged), and on the Triton kernel (a band with
    ragged lengths; TND with sinks). (A call with an int8 or uint8 full mask makes its plan anew.)"""
    gen = torch.Generator(device=device).manual_seed(13)
    base = dict(num_heads=HEADS, num_key_value_heads=KV_HEADS, scale=D ** -0.5)
    table = torch.randperm(8, generator=torch.Generator().manual_seed(2)).view(2, 4)
    return {
        "prefill causal": ((2, HEADS, 300, D), (2, KV_HEADS, 300, D), dict(
            base, input_layout="BNSD", sparse_mode=3,
            atten_mask=pasa_npu.compressed_causal_mask(device)), False),
        "prefill paged": ((2, HEADS, 256, D), (8, 128, KV_HEADS * D), dict(
            base, input_layout="BNSD", block_table=table.to(torch.int32).to(device),
            block_size=128, actual_seq_lengths_kv=[512, 512]), False),
        "prefill ragged band": ((2, HEADS, 200, D), (2, KV_HEADS, 250, D), dict(
            base, input_layout="BNSD", actual_seq_lengths=[200, 120], softmax_lse_flag=True,
            sparse_mode=4, pre_tokens=64, next_tokens=0,
            atten_mask=pasa_npu.compressed_causal_mask(device)), False),
        "prefill v2 TND sinks": ((300, HEADS, D), (500, KV_HEADS, D), dict(
            num_query_heads=HEADS, num_key_value_heads=KV_HEADS, softmax_scale=D ** -0.5,
            input_layout="TND", actual_seq_qlen=[100, 300], actual_seq_kvlen=[200, 500],
            learnable_sink=torch.randn(HEADS, device=device, generator=gen)), True),
    }


@needs_gpu
@pytest.mark.parametrize("form", ["BNSD", "BSH lengths, LSE", "paged BSH", "v2 TND sinks",
                                  "prefill causal", "prefill paged", "prefill ragged band",
                                  "prefill v2 TND sinks"])
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_plan_repeats_its_recorded_launches_on_new_tensors(form, algorithm, monkeypatch):
    """A call of a plan after its first launches what the first recorded (workspaces made
    again, no launch through Triton's binding or our launch key), bit for bit as a call
    launched unbound, on the plan's stream and on another (graph replays off: the launches
    themselves)."""
    from pasa_npu.fallback import kernel_common
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", False)
    (call, plan), q_shape, kv_shape, keywords, rand = _gpu_form(form, algorithm)
    call(rand(*q_shape), rand(*kv_shape), rand(*kv_shape), **keywords)
    q, k, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape)
    keyed, executed = [], []
    launch, execute = kernel_common._launch, pasa_npu.plans.execute
    monkeypatch.setattr(kernel_common, "_launch", lambda *a: keyed.append(a) or launch(*a))
    monkeypatch.setattr(pasa_npu.plans, "execute", lambda *a: executed.append(a) or execute(*a))
    before = kernel_common.FAST_LAUNCHES[0]
    bound = call(q, k, v, **keywords)
    assert kernel_common.FAST_LAUNCHES[0] > before and not keyed, \
        "the plan's recorded launches did not run"
    planned = plan(q, k, v, **keywords)
    runs = [planned.run(q, k, v) for _ in range(2)]
    # straight from the API layer to the record (plans.repeat), but where a band may
    # empty rows, which the full path's row rules handle
    assert (not executed) == (form != "prefill ragged band")
    monkeypatch.setattr(pasa_npu.plans, "execute", execute)
    monkeypatch.setattr(kernel_common, "_launch", launch)
    pasa_npu.plans.clear()
    kernel_common._LAUNCHES.clear()
    unbound = call(q, k, v, **keywords)
    for got in (bound, *runs):
        assert all(torch.equal(a, b) for a, b in zip(got, unbound))
    side = torch.cuda.Stream()  # another stream: launched unbound there, the same results
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = call(q, k, v, **keywords)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(other, unbound))


#: the argument forms whose recorded calls the graph tests replay
GRAPH_FORMS = ["BNSD", "BSH lengths, LSE", "paged BSH", "v2 TND sinks", "prefill causal",
               "prefill paged", "prefill v2 TND sinks"]


@needs_gpu
@pytest.mark.parametrize("form", GRAPH_FORMS)
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_repeats_on_the_same_addresses_replay_a_graph_of_the_launches(form, algorithm,
                                                                      monkeypatch):
    """Calls of a plan on tensors at addresses an earlier repeat used replay a CUDA graph of
    the recorded launches: the graph reads the tensors' contents at each call, bit for
    bit as launches without graphs, and so does a call on tensors at new addresses; with
    ``GRAPH_REPEATS`` off no graph is made."""
    from pasa_npu.fallback import kernel_common
    (call, _), q_shape, kv_shape, keywords, rand = _gpu_form(form, algorithm)
    q, k, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape)
    contents = [tuple(rand(*t.shape) for t in (q, k, v)) for _ in range(3)]

    def results(graphs: bool) -> list:
        """Every call's outputs, copied, for each of the contents written into q, k, v; the
        calls, graphs captured and replayed, without a host synchronisation."""
        monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", graphs)
        pasa_npu.plans.clear()
        call(q, k, v, **keywords)  # the plan's first call: it may read lengths or a table
        got = []
        for new in (*contents, contents[0]):
            for t, c in zip((q, k, v), new):
                t.copy_(c)
            for _ in range(3):  # the outputs freed at once: the next call's at their addresses
                torch.cuda.set_sync_debug_mode("error")
                try:
                    out = call(q, k, v, **keywords)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                got.append([t.cpu() for t in out])
                del out
        return got

    before = kernel_common.GRAPH_REPLAYS[0]
    plain = results(False)
    assert kernel_common.GRAPH_REPLAYS[0] == before
    replayed = results(True)
    assert kernel_common.GRAPH_REPLAYS[0] > before, "no repeat replayed a graph"
    for got, want in zip(replayed, plain):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not all(torch.equal(a, b) for a, b in zip(plain[0], plain[3])), \
        "the contents do not change the outputs: the test would not see a stale graph"
    elsewhere = [rand(*t.shape) for t in (q, k, v)]  # new addresses
    fresh = call(*elsewhere, **keywords)
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", False)
    pasa_npu.plans.clear()
    assert all(torch.equal(a, b) for a, b in zip(fresh, call(*elsewhere, **keywords)))


def _ungraphed_results(form: str, algorithm: str, n_sets: int, monkeypatch) -> tuple:
    """(the form's call, its keywords, ``n_sets`` sets of inputs, the outputs of each set
    from launches without graphs, on the host), where the driver and torch can rewrite a
    graph's kernel arguments; the test is skipped where they cannot."""
    from pasa_npu.fallback import graph_update, kernel_common
    if not graph_update.supported():
        pytest.skip("this driver or torch cannot rewrite a graph's kernel arguments")
    (call, _), q_shape, kv_shape, keywords, rand = _gpu_form(form, algorithm)
    sets = [tuple(rand(*shape) for shape in (q_shape, kv_shape, kv_shape))
            for _ in range(n_sets)]
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", False)
    pasa_npu.plans.clear()
    want = [[t.cpu() for t in call(*inputs, **keywords)] for inputs in sets]
    return call, keywords, sets, want


@needs_gpu
@pytest.mark.parametrize("form", GRAPH_FORMS)
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_repeats_at_new_addresses_replay_the_graph_with_their_addresses(form, algorithm,
                                                                         monkeypatch):
    """From a plan's second call on, every call replays the one graph of its recorded
    launches, each kernel's address arguments (pointers, TMA maps) rewritten for the call's
    tensors wherever they lie: bit for bit as launches without graphs, with no kernel
    launched and no host synchronisation, on tensors that take turns in an order that
    returns to each."""
    from pasa_npu.fallback import kernel_common
    call, keywords, sets, want = _ungraphed_results(form, algorithm, 4, monkeypatch)
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", True)
    pasa_npu.plans.clear()
    order = [0, 1, 2, 1, 3, 0, 0, 2]
    call(*sets[order[0]], **keywords)  # the record: it may read lengths or a table
    call(*sets[order[1]], **keywords)  # the capture
    replays, launches = kernel_common.GRAPH_REPLAYS[0], kernel_common.FAST_LAUNCHES[0]
    for i in order[2:]:
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = call(*sets[i], **keywords)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want[i])), f"inputs {i}"
    assert kernel_common.GRAPH_REPLAYS[0] - replays == len(order) - 2
    assert kernel_common.FAST_LAUNCHES[0] == launches, "a call launched its kernels"
    assert not all(torch.equal(a, b) for a, b in zip(want[0], want[1]))


@needs_gpu
@pytest.mark.parametrize("form", ["BSH lengths, LSE", "prefill causal"])
@pytest.mark.parametrize("algorithm", ["pasa-exact", "fa-fp32"])
def test_a_graph_the_driver_refuses_to_launch_replays_through_torch(form, algorithm,
                                                                     monkeypatch):
    """Where the driver's ``cuGraphLaunch`` fails, the addressed graph replays through
    torch's own graph replay: the same results, bit for bit, at new addresses as at
    repeated ones, and still no kernel launched of its own."""
    from pasa_npu.fallback import graph_update, kernel_common
    call, keywords, sets, want = _ungraphed_results(form, algorithm, 3, monkeypatch)
    refused = []
    real_driver = graph_update._driver

    def driver():
        calls = dict(real_driver())
        calls["launch"] = lambda *args: refused.append(args) or 1  # CUDA_ERROR_INVALID_VALUE
        return calls
    monkeypatch.setattr(graph_update, "_driver", driver)
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", True)
    pasa_npu.plans.clear()
    order = [0, 1, 2, 1, 0, 0]
    call(*sets[order[0]], **keywords)  # the record
    call(*sets[order[1]], **keywords)  # the capture
    replays, launches = kernel_common.GRAPH_REPLAYS[0], kernel_common.FAST_LAUNCHES[0]
    for i in order[2:]:
        got = call(*sets[i], **keywords)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want[i])), f"inputs {i}"
    assert kernel_common.GRAPH_REPLAYS[0] - replays == len(order) - 2
    assert kernel_common.FAST_LAUNCHES[0] == launches, "a call launched its kernels"
    assert len(refused) >= len(order) - 2, "the driver's launch was never tried"
    pasa_npu.plans.clear()


@needs_gpu
@pytest.mark.parametrize("form", ["BSH lengths, LSE", "prefill causal"])
def test_a_graph_the_driver_cannot_instantiate_leaves_the_recorded_launches(form, monkeypatch):
    """Where the captured graph cannot be instantiated, the plan launches its recorded kernels,
    at that call and every later one: the same results, bit for bit, as launches without
    graphs, and no graph replayed."""
    from pasa_npu.fallback import kernel_common
    call, keywords, sets, want = _ungraphed_results(form, "pasa-exact", 3, monkeypatch)
    tried = []

    def refuse(graph):
        tried.append(graph)
        raise RuntimeError("CUDA error: operation not supported when instantiating the graph")
    monkeypatch.setattr(torch.cuda.CUDAGraph, "instantiate", refuse)
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", True)
    pasa_npu.plans.clear()
    replays, launches = kernel_common.GRAPH_REPLAYS[0], kernel_common.FAST_LAUNCHES[0]
    for i in [0, 1, 2, 1, 0]:
        got = call(*sets[i], **keywords)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want[i])), f"inputs {i}"
    assert tried, "no graph was captured"
    assert kernel_common.GRAPH_REPLAYS[0] == replays
    assert kernel_common.FAST_LAUNCHES[0] > launches, "the repeats did not launch their kernels"
    pasa_npu.plans.clear()


@needs_gpu
@pytest.mark.parametrize("form", ["BNSD", "prefill causal"])
def test_a_call_whose_key_is_its_value_repeats_its_recorded_launches(form, monkeypatch):
    """K and V one tensor: the plan's later calls of that kind repeat the recorded launches,
    bit for bit as unrecorded; a call of the same plan with K and V apart takes the full
    path."""
    from pasa_npu.fallback import kernel_common
    _, q_shape, kv_shape, keywords, rand = _gpu_form(form, "pasa")
    kv = rand(*kv_shape)
    pasa_npu.fused_attention(rand(*q_shape), kv, kv, **keywords)
    q, kv, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape)
    keyed = []
    launch = kernel_common._launch
    monkeypatch.setattr(kernel_common, "_launch", lambda *a: keyed.append(a) or launch(*a))
    shared = pasa_npu.fused_attention(q, kv, kv, **keywords)
    assert not keyed, "the recorded launches did not run"
    apart = pasa_npu.fused_attention(q, kv, v, **keywords)
    assert keyed, "a call with K and V apart repeated launches recorded with one tensor"
    monkeypatch.setattr(kernel_common, "_launch", launch)
    pasa_npu.plans.clear()
    expected = [pasa_npu.fused_attention(q, kv, value, **keywords) for value in (kv, v)]
    for got, want in zip((shared, apart), expected):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@needs_gpu
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_calls_with_host_lengths_never_synchronise(algorithm):
    """Every decode form above, causal prefill (its optimized mask also made under inference
    mode), dense prefill, and explicit masks that may empty rows (prefill and decode), under
    ``torch.cuda.set_sync_debug_mode("error")`` once planned (a device block table is
    checked with one read-back when first seen)."""
    forms, rand = _decode_forms("cuda")
    mask = pasa_npu.compressed_causal_mask("cuda")
    forms["prefill causal"] = ((1, HEADS, 300, D), (1, KV_HEADS, 300, D), dict(
        num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BNSD", scale=D ** -0.5,
        sparse_mode=3, atten_mask=mask), False)
    with torch.inference_mode():  # a serving loop's mask may be an inference tensor
        inference_mask = torch.ones(2048, 2048, dtype=torch.bool, device="cuda").triu(1)
    forms["prefill causal, inference-mode mask"] = forms["prefill causal"][:2] + (
        dict(forms["prefill causal"][2], atten_mask=inference_mask), False)
    forms.update(_mask_forms("cuda"))
    forms["prefill BSND"] = ((2, 200, HEADS, D), (2, 250, KV_HEADS, D), dict(
        num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="BSND", scale=D ** -0.5),
        False)
    calls = []
    for name, (q_shape, kv_shape, keywords, v2) in forms.items():
        keywords = dict(keywords, algorithm=algorithm, backend="triton")
        tensors = (rand(*q_shape), rand(*kv_shape), rand(*kv_shape))
        _entries(v2)[0](*tensors, **keywords)
        calls.append((name, tensors, keywords, v2))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for name, tensors, keywords, v2 in calls:
            call, plan = _entries(v2)
            try:
                call(*tensors, **keywords)
                plan(*tensors, **keywords).run(*tensors)
            except RuntimeError as err:
                raise AssertionError(f"{name}: {err}") from err
    finally:
        torch.cuda.set_sync_debug_mode("default")


#: forms of _decode_forms, _prefill_forms and _mask_forms, with ragged lengths, so that the
#: host lists' calls run the same kernels (packed, the prefill kernel: the host does not
#: know that every query length is 1)
DEVICE_LENGTH_FORMS = {"BSH lengths, LSE": {}, "paged BSH": {}, "paged BSH, host table": {},
                       "v2 TND sinks": dict(actual_seq_qlen=[0, 2]),
                       "prefill paged": dict(actual_seq_lengths_kv=[512, 300]),
                       "prefill ragged band": {}, "prefill v2 TND sinks": {},
                       "prefill explicit mask": {}, "prefill explicit mask, row-invalid": {},
                       "decode explicit mask": {}}


@needs_gpu
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_calls_with_device_lengths_never_synchronise(algorithm):
    """Lengths given as CUDA tensors stay on the device (docs/design.md, "No host
    synchronisation"): decode, paged decode, packed prefill (v2, with sinks; one empty),
    ragged paged causal prefill, a ragged band, and explicit masks that empty rows, each as
    a call and a plan's run under ``torch.cuda.set_sync_debug_mode("error")``, with the
    block table on the device or the host, give the results of the same lengths as host
    lists bit for bit; a CUDA graph captured with them replays the lengths written into
    them after the capture."""
    forms, rand = _decode_forms("cuda")
    forms.update(_prefill_forms("cuda"))
    forms.update(_mask_forms("cuda"))
    cases = []
    for name, changes in DEVICE_LENGTH_FORMS.items():
        q_shape, kv_shape, keywords, v2 = forms[name.removesuffix(", host table")]
        keywords = dict(keywords, **changes, algorithm=algorithm, backend="triton")
        if name.endswith("host table"):
            keywords["block_table"] = keywords["block_table"].cpu()
        if name.startswith("prefill") and "atten_mask" not in keywords:
            keywords["sparse_mode"] = keywords.get("sparse_mode", 3)
            keywords["atten_mask"] = pasa_npu.compressed_causal_mask("cuda")
        on_device = {key: torch.tensor(value, device="cuda") if key.startswith("actual")
                     else value for key, value in keywords.items()}
        tensors = (rand(*q_shape), rand(*kv_shape), rand(*kv_shape))
        call, plan = _entries(v2)
        want = call(*tensors, **keywords)
        call(*tensors, **on_device)  # compiles
        cases.append((name, tensors, on_device, want, call, plan))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [(call(*tensors, **on_device), plan(*tensors, **on_device).run(*tensors))
               for _, tensors, on_device, _, call, plan in cases]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for (name, *_, want, _, _), results in zip(cases, got):
        for result in results:
            for a, b in zip(result, want):
                assert torch.equal(a, b), name

    name, tensors, on_device, *_ = cases[0]  # decode: a graph replayed on new lengths
    lengths = on_device["actual_seq_lengths_kv"]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        pasa_npu.fused_attention(*tensors, **on_device)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = pasa_npu.fused_attention(*tensors, **on_device)
    for new in ([500, 650], [0, 700]):
        lengths.copy_(torch.tensor(new))
        graph.replay()
        want = pasa_npu.fused_attention(*tensors, **dict(on_device, actual_seq_lengths_kv=new))
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1]), new


@needs_gpu
@pytest.mark.parametrize("form", ["BNSD", "prefill causal"])
def test_recorded_launches_reach_tritons_c_launcher_and_honour_launch_hooks(form, monkeypatch):
    """A plan's repeated launches call Triton's C launcher without its Python launch path,
    on other tensors and back (the TMA maps filled per base address); with a launch hook
    set they take that path, and the hook sees each launch. Results bit for bit (graph
    replays off: the launches themselves)."""
    from triton import knobs

    from pasa_npu.fallback import kernel_common
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", False)
    (call, _), q_shape, kv_shape, keywords, rand = _gpu_form(form, "pasa")
    inputs = [(rand(*q_shape), rand(*kv_shape), rand(*kv_shape)) for _ in range(2)]
    first = [call(*qkv, **keywords) for qkv in inputs]
    through = []
    run_compiled = kernel_common._run_compiled
    monkeypatch.setattr(kernel_common, "_run_compiled",
                        lambda *a: through.append(a) or run_compiled(*a))
    before = kernel_common.FAST_LAUNCHES[0]
    again = [call(*inputs[i], **keywords) for i in (1, 0, 1)]
    assert kernel_common.FAST_LAUNCHES[0] > before and not through
    seen = []
    hook = seen.append
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):  # a chain of hooks (Triton 3.5 and later)
        chain.add(hook)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    try:
        hooked = call(*inputs[0], **keywords)
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
    assert through and len(seen) == len(through)
    for got, want in zip((*again, hooked), (first[1], first[0], first[1], first[0])):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_the_kernels_leave_the_counters_a_plan_reuses_zeroed(algorithm, monkeypatch):
    """The prefill's tile counter, overflow word and repair arrivals (``Binding.zeroed``),
    which a recorded call keeps and reuses, are zero again after every call, one whose
    scores overflow (rows repaired) and one whose do not; the plan's later calls repeat
    its results bit for bit. On a GPU the Gluon kernel's tile counter with more tiles
    than programs; under the interpreter the Triton kernel and repair."""
    from pasa_npu.fallback import kernel_common
    made = []
    zeroed = kernel_common.Binding.zeroed
    monkeypatch.setattr(kernel_common.Binding, "zeroed",
                        lambda self, *a: made.append(zeroed(self, *a)) or made[-1])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, n, s, d = (2, 16, 1024, 64) if dev == "cuda" else (1, 2, 160, 32)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(b, n, s, d, generator=gen) for _ in range(3))
    calm = (q.half().to(dev), k.half().to(dev), v.half().to(dev))
    sign = torch.randint(0, 2, (b, n, s), generator=gen) * 2.0 - 1.0
    k[..., 0] = sign * 3.5  # scores of +-1.05e5 (beyond fp16) on the rows below
    q[:, :, :48, 0] = 3e4
    spread = (q.half().to(dev), k.half().to(dev), v.half().to(dev))
    keywords = dict(num_heads=n, input_layout="BNSD", scale=1.0, algorithm=algorithm,
                    backend="triton")
    firsts = {}
    names = ("spread", "calm", "spread", "calm", "spread")
    reports = []
    for name in names:
        out, _ = pasa_npu.fused_attention(*(spread if name == "spread" else calm), **keywords)
        if dev == "cuda":
            torch.cuda.synchronize()
        reports.append(pasa_npu.overflow_report())
        assert (reports[-1].rows > 0) == (name == "spread"), reports[-1]
        assert made and all(int(t.abs().sum()) == 0 for t in made), made
        assert torch.equal(out, firsts.setdefault(name, out))
    if dev == "cuda":
        assert len(made) == 1, "the recorded call made its counters again"
    # each report counted when it was asked for: the plan's later calls, which write the
    # same row flags on a GPU, change none
    assert [r.rows > 0 for r in reports] == [name == "spread" for name in names]


def test_a_direct_launch_passes_what_tritons_launcher_would(monkeypatch):
    """``kernel_common._direct_send`` with Triton's C launcher replaced by a recorder: the
    head (grid, stream, function, metadata, no hooks), the plan's pointers as addresses
    bound once and the call's on each launch, each TMA descriptor expanded as Triton
    expands it, its map filled once per base address; a launch hook sends the launch
    through Triton's own path instead."""
    pytest.importorskip("triton.backends.nvidia.driver")
    from types import SimpleNamespace

    from triton.backends.nvidia import driver as nvidia

    from pasa_npu.fallback import kernel_common

    sent, fills, through = [], [], []
    launcher = lambda *args: sent.append(args)  # noqa: E731

    def wrapped(*args):  # as Triton wraps its C launcher for a kernel with descriptors
        return launcher(*args)

    run = object.__new__(nvidia.CudaLauncher)
    run.__dict__.update(launch=wrapped, global_scratch_size=0, profile_scratch_size=0,
                        launch_cooperative_grid=False, launch_pdl=False)
    signature = {"Q": "*fp16", "D": "tensordesc<fp16[16, 16]>", "T": "*i32", "n": "i32",
                 "FLAG": "constexpr"}
    compiled = SimpleNamespace(run=run, src=SimpleNamespace(signature=signature),
                               metadata=SimpleNamespace(tensordesc_meta=[{"m": 1}]),
                               function="fn", packed_metadata=(4, 1, 0), name="kernel")

    def expand(descriptor, meta):
        fills.append(descriptor.base.data_ptr())
        return [f"map@{descriptor.base.data_ptr()}", 16, 1]

    monkeypatch.setattr(nvidia, "make_tensordesc_arg", expand)
    monkeypatch.setattr(kernel_common, "_launch", lambda *a: (compiled, ["FLAG"]))
    monkeypatch.setattr(kernel_common, "_run_compiled",
                        lambda compiled_, grid, values, device: through.append(list(values)))
    monkeypatch.setattr(kernel_common, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 77)))
    q, table = torch.zeros(4, 8), torch.zeros(2, dtype=torch.int32)
    descriptor = SimpleNamespace(base=q)
    bound = kernel_common.PreparedLaunch.launch("k", (3,), (q, descriptor, table, 5),
                                                {"FLAG": True}, {"q": q, "desc": descriptor})
    assert bound.values == [None, None, table.data_ptr(), 5, True] and bound.keep == (table,)
    q2 = torch.ones(4, 8)
    for tensor in (q2, q2, q):
        bound.run({"q": tensor, "desc": SimpleNamespace(base=tensor)})
    head = (3, 1, 1, 77, "fn", False, False, None, None, (4, 1, 0), None, None, None)
    assert [args[:13] for args in sent] == [head] * 3
    assert [args[13:] for args in sent] == [
        (t.data_ptr(), f"map@{t.data_ptr()}", 16, 1, table.data_ptr(), 5, True)
        for t in (q2, q2, q)]
    assert fills == [q2.data_ptr(), q.data_ptr()]  # one fill per base address
    hook = lambda metadata: None  # noqa: E731
    monkeypatch.setattr(kernel_common.knobs.runtime, "launch_enter_hook", hook)
    bound.run({"q": q2, "desc": descriptor})
    assert len(sent) == 3 and through[0][0] == q2.data_ptr() and through[0][1] is descriptor
    # a descriptor over a role's tensor (Binding.descriptor): made from its template over
    # each call's tensor only where that tensor's address has no map yet, and made for
    # Triton's own path
    monkeypatch.setattr(kernel_common.knobs.runtime, "launch_enter_hook", None)
    template = type("Descriptor", (), {})()  # as rebase copies TensorDescriptor's fields
    template.base = None
    bound = kernel_common.PreparedLaunch.launch("k", (3,), (q, descriptor, table, 5),
                                                {"FLAG": True}, {"q": q},
                                                {id(descriptor): ("q", template)})
    assert bound.values == [None, None, table.data_ptr(), 5, True]
    fills.clear()
    q3 = torch.full((4, 8), 3.0)
    for tensor in (q3, q3, q):
        bound.run({"q": tensor})
    assert [args[13:] for args in sent[3:]] == [
        (t.data_ptr(), f"map@{t.data_ptr()}", 16, 1, table.data_ptr(), 5, True)
        for t in (q3, q3, q)]
    assert fills == [q3.data_ptr(), q.data_ptr()]
    monkeypatch.setattr(kernel_common.knobs.runtime, "launch_enter_hook", hook)
    bound.run({"q": q3})
    assert through[-1][1].base is q3 and through[-1][1] is not template


def test_a_recorded_call_swaps_in_each_calls_tensors_and_keeps_none(monkeypatch):
    """Binding and PreparedCall's bookkeeping, with Triton's launcher replaced by a
    recorder: a repeat makes its own workspaces and what is derived from its tensors, the
    roles' positions get the new call's objects, everything else stays as bound, no
    reference to the binding call's tensors is kept, and a tensor of other strides or
    alignment, or with roles shared otherwise (a key that is the value), launches
    nothing."""
    import weakref

    from pasa_npu.fallback import kernel_common

    launched = []
    monkeypatch.setattr(kernel_common, "_launch", lambda kernel, grid, args, kwargs: (
        "compiled", ["FLAG"]))
    monkeypatch.setattr(kernel_common, "_run_compiled",
                        lambda compiled, grid, values, device: launched.append(list(values)))
    monkeypatch.setattr(kernel_common, "driver", type("D", (), {"active": type(
        "A", (), {"get_current_device": staticmethod(lambda: 0)})}))
    q, out, table = torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(2, dtype=torch.int32)
    binding = kernel_common.Binding({"q": q, "out": out})
    counters = binding.empty("counters", (2,), torch.int32, "cpu", 0)
    word = binding.derive("word", counters, lambda t: t[1:])
    rows = binding.derive("rows", q, lambda t: t[:2])
    assert binding.derive("constant", table, lambda t: t[:1]).shape == (1,)  # not a role
    binding.launch("kernel", (3,), q, table, out, word, rows, 7, q.stride(0), FLAG=True)
    recorded = binding.prepared()
    bound = [a for a in recorded.actions if isinstance(a, kernel_common.PreparedLaunch)]
    assert len(recorded.actions) == 4 and len(bound) == 1  # counters, word, rows; launch
    assert bound[0].values == [None, table, None, None, None, 7, 8, True]
    assert not launched  # the first launch is Triton's own (the stand-in records repeats)
    alive = weakref.ref(q)
    del q, binding, rows
    assert alive() is None, "the recorded call keeps the binding call's query alive"
    q2, out2 = torch.ones(4, 8), torch.ones(4, 8)
    assert recorded({"q": q2, "out": out2})
    again = launched[-1]
    assert again[0] is q2 and again[2] is out2 and again[1] is table
    assert again[3].shape == (1,) and again[3].item() == 0 and again[3] is not word
    assert again[4].data_ptr() == q2.data_ptr() and again[4].shape == (2, 8)
    assert not recorded({"q": torch.ones(8, 4).t(), "out": out2})  # other strides
    assert not recorded({"q": torch.ones(33)[1:].view(4, 8), "out": out2})  # misaligned
    assert len(launched) == 1
    # a key that is the value: repeated only on calls whose key is their value
    kv = torch.zeros(3)
    binding = kernel_common.Binding({"key": kv, "value": kv})
    binding.launch("kernel", (1,), kv, kv, FLAG=True)
    recorded = binding.prepared()
    kv2, other = torch.ones(3), torch.full((3,), 2.0)
    assert recorded({"key": kv2, "value": kv2})
    assert launched[-1][0] is kv2 and launched[-1][1] is kv2
    assert not recorded({"key": kv2, "value": other})
    assert len(launched) == 2
    binding = kernel_common.Binding({"key": kv2, "value": other})  # and the other way round
    binding.launch("kernel", (1,), kv2, other, FLAG=True)
    assert not binding.prepared()({"key": kv, "value": kv})



def test_which_recorded_calls_may_replay_a_graph(monkeypatch):
    """A record replays graphs only where every launch is direct and no workspace made on
    every call is over ``GRAPH_WORKSPACE_BYTES`` (a graph would keep it), and replays one
    graph on any call's addresses unless a step derives from both a workspace made on
    every call (the graph's own) and the call's tensors; none with ``GRAPH_REPEATS``
    off."""
    import functools

    from pasa_npu.fallback import kernel_common

    direct = kernel_common.PreparedLaunch("k", None, [], (), direct=True)
    through = kernel_common.PreparedLaunch("k", None, [], (), direct=False)

    def filled(nbytes):
        return functools.partial(kernel_common._make_workspace, "w", (nbytes // 4,),
                                 torch.int32, "cpu", 0)

    def graphs(*actions):
        return kernel_common.PreparedCall(actions, ()).graphs is not None

    limit = kernel_common.GRAPH_WORKSPACE_BYTES
    assert graphs(direct, direct) and graphs(filled(limit), direct)
    assert not graphs(direct, through) and not graphs(filled(limit + 4), direct)
    assert kernel_common.PreparedCall((direct,), ()).kernels == 1
    # the graph that takes any call's addresses: a workspace made on each call, and what is
    # derived from it, the graph's own; not where a step derives from it and from the
    # call's tensors
    monkeypatch.setattr(kernel_common.graph_update, "supported", lambda: True)

    def derived(name, *roles):
        return functools.partial(kernel_common._derive, name,
                                 tuple((role, None) for role in roles), lambda *t: t[0])
    assert kernel_common.PreparedCall((direct,), ()).addressed is None
    owning = kernel_common.PreparedCall((filled(4), derived("view", "w"), direct), ())
    assert owning.addressed is None and owning.owned == {"w", "view"} and owning.computes
    mixed = kernel_common.PreparedCall((filled(4), derived("both", "w", "query"), direct), ())
    assert mixed.addressed is False
    monkeypatch.setattr(kernel_common, "GRAPH_REPEATS", False)
    assert not graphs(direct)
    assert kernel_common.PreparedCall((direct,), ()).addressed is False


def test_a_recording_keeps_its_workspaces_within_the_budget(monkeypatch):
    """A recorded call's workspaces (``Binding.empty`` without a fill) are kept for its
    repeats: the same tensor on every repeat, what is made from their contents (a
    gather) made again on each, what only points into them (a view, a descriptor) made
    once. Past the device's budget a recording allocates anew on every repeat, and the
    bytes it kept return to the budget when the recording goes."""
    import gc

    from pasa_npu.fallback import kernel_common

    launched = []
    monkeypatch.setattr(kernel_common, "_launch", lambda kernel, grid, args, kwargs: (
        "compiled", []))
    monkeypatch.setattr(kernel_common, "_run_compiled",
                        lambda compiled, grid, values, device: launched.append(list(values)))
    monkeypatch.setattr(kernel_common, "driver", type("D", (), {"active": type(
        "A", (), {"get_current_device": staticmethod(lambda: 0)})}))
    monkeypatch.setattr(kernel_common, "KEPT_WORKSPACE_BYTES", 64)
    cpu = torch.device("cpu")
    base = kernel_common.kept_workspace_bytes(cpu)

    def record(q):
        binding = kernel_common.Binding({"q": q})
        work = binding.empty("work", (2, 4), torch.float32, cpu)  # 32 bytes
        view = binding.derive("row", work, lambda t: t[1], reads_contents=False)
        copy = binding.derive("copy", work, lambda t: t.sum().reshape(1))
        binding.launch("kernel", (1,), q, work, view, copy)
        return binding.prepared()

    first = record(torch.zeros(4))
    assert kernel_common.kept_workspace_bytes(cpu) == base + 32
    for fill in (1.0, 2.0):
        assert first({"q": torch.zeros(4)})
        _, work, view, copy = launched[-1]
        work.fill_(fill)  # the next repeat's gather reads what this one left
    assert launched[-1][1] is launched[-2][1], "a repeat allocated its kept workspace anew"
    assert launched[-1][2] is launched[-2][2], "a view of a kept workspace was made again"
    assert launched[-1][3] is not launched[-2][3] and launched[-1][3].item() == 8.0
    second = record(torch.zeros(4))  # 64 bytes kept: the budget is full
    third = record(torch.zeros(4))
    assert kernel_common.kept_workspace_bytes(cpu) == base + 64
    third({"q": torch.zeros(4)})
    third({"q": torch.zeros(4)})
    assert launched[-1][1] is not launched[-2][1], "a recording past the budget kept its workspace"
    del first, second, third, work, view, copy
    launched.clear()
    gc.collect()
    assert kernel_common.kept_workspace_bytes(cpu) == base
    # an allocation that fails keeps nothing counted
    monkeypatch.setattr(kernel_common.torch, "empty", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("out of memory")))
    with pytest.raises(RuntimeError, match="out of memory"):
        kernel_common.kept_workspace((2,), torch.float32, cpu)
    assert kernel_common.kept_workspace_bytes(cpu) == base


@pytest.mark.parametrize("text", ["-1", "lots", "1.5"])
def test_a_bad_kept_workspace_budget_is_refused_naming_the_variable(text, monkeypatch):
    from pasa_npu.fallback import kernel_common

    monkeypatch.setenv("PASA_NPU_KEPT_WORKSPACE_MIB", text)
    with pytest.raises(ValueError, match=f"PASA_NPU_KEPT_WORKSPACE_MIB must be a whole "
                                         f"number of MiB >= 0, got '{text}'"):
        kernel_common._env_mib("PASA_NPU_KEPT_WORKSPACE_MIB", 512)
    monkeypatch.setenv("PASA_NPU_KEPT_WORKSPACE_MIB", "64")
    assert kernel_common._env_mib("PASA_NPU_KEPT_WORKSPACE_MIB", 512) == 64

@needs_gpu
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
def test_every_golden_form_with_device_lengths_never_synchronises(algorithm):
    """Every argument form of the golden matrix (tests/test_golden.py) and the paged cases
    (tests/_paged.py), fp16, with its lengths as CUDA tensors (the explicit-mask forms,
    which have none, with ragged ones: tests/api/test_device_lengths.py), planned once,
    then called and run from its plan under ``torch.cuda.set_sync_debug_mode("error")``:
    no host synchronisation, and the results of the first call."""
    from _paged import PAGED_CASES, paged_case
    from test_golden import CASES, MASK_LENGTHS, make_case

    cases = []
    for name, case in {**CASES, **{f"paged {n}": c for n, c in PAGED_CASES.items()}}.items():
        if name.startswith("paged "):
            q, k, v, kw, _ = paged_case(case, torch.float16)
        else:
            q, k, v, kw = make_case(case, torch.float16)
            if name in MASK_LENGTHS:
                kw.update(MASK_LENGTHS[name](case["S1"], case["S2"]))
        kw = {key: (value.cuda() if isinstance(value, torch.Tensor) else
                    torch.tensor(value, device="cuda") if key.startswith("actual") else value)
              for key, value in kw.items()}
        kw.update(algorithm=algorithm, backend="triton")
        tensors = tuple(t.cuda() for t in (q, k, v))
        try:
            want = pasa_npu.fused_attention(*tensors, **kw)
        except NotImplementedError:  # a form the Triton backend refuses, with its reason
            continue
        cases.append((name, tensors, kw, want))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    got, synchronised = [], []
    try:
        for name, tensors, kw, _ in cases:
            try:
                got.append((pasa_npu.fused_attention(*tensors, **kw),
                            pasa_npu.plan(*tensors, **kw).run(*tensors)))
            except RuntimeError as err:
                synchronised.append(f"{name}: {err}")
                got.append(())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not synchronised, synchronised
    differ = [name for (name, *_, want), results in zip(cases, got) for result in results
              if not all(torch.equal(a.nan_to_num(), b.nan_to_num())
                         and torch.equal(a.isnan(), b.isnan()) for a, b in zip(result, want))]
    assert not differ, differ
    assert len(cases) > len(CASES), [name for name, *_ in cases]
