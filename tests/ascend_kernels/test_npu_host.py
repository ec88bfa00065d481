"""The NPU host code, checked without CANN or an NPU:

* the torch_npu binding and the host sources compile against torch's headers and those of the
  torch_npu wheel matching the installed torch (fetched with pip download, cached), and link
  against torch and the wheel's libtorch_npu.so; only the launch headers CANN generates are
  stood in for, written from the kernels' signatures;
* the kernel sources compile against the real AscendC headers (../shared/ascendc-check);
* the shared host launcher makes the same runtime calls through the ACL runtime (compiled
  against the real ACL headers, linked with recording stand-ins for the ACL functions it calls)
  as through the emulated runtime that backend ascendc-emu runs: allocations, uploads (bytes
  included) and launches with their block counts and arguments, in the same order.
"""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import _npu_host as host

from pasa_npu import npu_params

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")


@pytest.fixture(scope="module")
def torch_npu_include():
    return host.torch_npu_include()


@pytest.fixture(scope="module")
def launch_headers(tmp_path_factory):
    directory = tmp_path_factory.mktemp("aclrtlaunch")
    host.write_launch_headers(directory)
    return directory


def _errors(proc: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in proc.stderr.splitlines() if "error" in line)[:4000]


def test_launch_header_stand_ins_cover_every_kernel(launch_headers):
    """One stand-in per kernel the ACL runtime launches, with the kernel's parameters."""
    signatures = host.kernel_signatures()
    assert set(signatures) == {"pasa_attention", "pasa_shift_keys", "pasa_center_keys", "pasa_merge_splits"}
    text = (launch_headers / "aclrtlaunch_pasa_attention.h").read_text()
    params = ", ".join(f"void* {name}" for _, name in signatures["pasa_attention"])
    assert f"aclrtlaunch_pasa_attention(uint32_t blockDim, aclrtStream stream, {params});" in text


def test_binding_compiles_and_links_against_torch_npu(torch_npu_include, launch_headers, tmp_path):
    """The binding and the host sources as objects, linked into a shared library against torch
    and the wheel's libtorch_npu.so: every symbol resolves but those CANN provides (ACL, the
    kernels' launch functions) and Python's."""
    objects = []
    for source, std, includes in [(host.BINDING, "c++20", host.binding_includes(torch_npu_include)),
                                  *[(host.HOST / s, "c++17", host.acl_includes(torch_npu_include))
                                    for s in ("pasa_launcher.cpp", "pasa_tiling.cpp", "pasa_acl_runtime.cpp")]]:
        obj = tmp_path / f"{source.stem}.o"
        proc = host.gxx([f"-std={std}", "-c", "-fPIC", "-O0", "-w", host.torch_abi_flag(),
                         f"-I{launch_headers}", *includes, str(source), "-o", str(obj)])
        assert proc.returncode == 0, f"{source.name} does not compile:\n{_errors(proc)}"
        objects.append(str(obj))
    proc = host.gxx(["-shared", "-o", str(tmp_path / "_npu.so"), *objects, *host.torch_npu_link_flags(),
                     "-Wl,--no-undefined", "-Wl,--allow-shlib-undefined"])
    unresolved = set(re.findall(r"undefined reference to `([^'(]+)", proc.stderr))
    assert unresolved and all(name.startswith(("acl", "Py")) for name in unresolved), (
        f"symbols neither torch nor torch_npu provides: {sorted(unresolved)}\n{proc.stderr[-3000:]}")
    assert {"aclrtMemcpyAsync", "aclrtGetDeviceInfo", "aclrtlaunch_pasa_attention"} <= unresolved


def test_kernels_compile_against_the_ascendc_headers():
    if not host.ASCENDC_CHECK.exists():
        pytest.skip(f"{host.ASCENDC_CHECK} does not exist here: the kernels' compile check against "
                    f"the AscendC headers needs ../shared/ascendc-check next to the repository")
    sources = sorted(str(p) for p in host.KERNELS.glob("*.cpp"))
    proc = subprocess.run([sys.executable, str(host.ASCENDC_CHECK), *sources], capture_output=True,
                          text=True, timeout=600, cwd=host.ROOT)
    assert proc.returncode == 0, f"ascendc-check failed:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"


# --------------------------------------------------------------------------- runtime calls


@pytest.fixture(scope="module")
def recorder(torch_npu_include, launch_headers, tmp_path_factory):
    exe = tmp_path_factory.mktemp("recorder") / "acl_recorder"
    sources = [host.HOST / "pasa_tiling.cpp", host.HOST / "pasa_launcher.cpp",
               host.HOST / "pasa_acl_runtime.cpp", host.ROOT / "tests" / "npu_host" / "acl_recorder.cpp"]
    proc = host.gxx(["-std=c++17", "-O1", f"-I{launch_headers}", f"-I{host.HOST}",
                     *host.acl_includes(torch_npu_include), *map(str, sources), "-o", str(exe)])
    assert proc.returncode == 0, f"the recorder does not build:\n{proc.stderr[:4000]}"
    return exe


def _acl_calls(exe, params: dict, lens: dict) -> list[str]:
    text = "".join(f"{k} {v}\n" for k, v in params.items())
    text += "".join(f"{k} {' '.join(map(str, v))}\n" for k, v in lens.items())
    proc = subprocess.run([str(exe)], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    errors = [line for line in lines if line.startswith("error")]
    assert not errors, errors
    issue = lines.index("issue")
    assert all(line.startswith("allocate") for line in lines[:issue]), lines
    assert not any(line.startswith("allocate") for line in lines[issue:]), lines
    return lines[:issue] + lines[issue + 1:]


def _emulated_calls(params: dict, lens: dict) -> list[str]:
    """Run the call under emulation; its runtime calls in the recorder's notation (allocations
    named by their order)."""
    p = params
    rng = np.random.default_rng(0)
    half = lambda *shape: rng.standard_normal(shape).astype(np.float16).view(np.int16)  # noqa: E731
    b, hq, hk, sq, skv = p["batch"], p["num_heads"], p["num_kv_heads"], p["seq_q"], p["seq_kv"]
    kb = p["num_blocks"] if p.get("paged") else b
    q, k, v = half(b, hq, sq, p["head_dim"]), half(kb, hk, skv, p["head_dim"]), half(kb, hk, skv, p["head_dim_v"])
    out = np.zeros((b, hq, sq, p["head_dim_v"]), np.int16)
    lse = np.zeros((b, hq, sq), np.float32)
    pages = {}
    if p.get("paged"):  # sequence b in blocks b, b + batch, ...; every entry owns its block
        table = np.arange(b * p["table_stride"], dtype=np.int32).reshape(p["table_stride"], b).T.copy()
        pages = dict(block_table=table, key_slots=np.arange(table.size, dtype=np.int32).reshape(table.shape))
    mask = None
    if p.get("has_mask"):
        rows = b if p.get("mask_batch_stride") else 1
        mask = (rng.random((rows, sq, p["mask_row_stride"])) < 0.3).astype(np.uint8)
    sink = rng.standard_normal(hq).astype(np.float32) if p.get("has_sink") else None
    flags = np.zeros((b, hq, sq), np.uint8) if p.get("overflow_check") else None
    result = emu.run_attention(q, k, v, out, lse, {n: np.asarray(x, np.int32) for n, x in lens.items()},
                               dict(params, timeout_s=60.0,
                                    timing=npu_params.timing_only(npu_params.values())), mask=mask,
                               sink=sink, row_flags=flags, **pages)
    names, lines = {}, []
    for call in result["runtime_calls"]:
        if call[0] == "allocate":
            names[call[1]] = f"alloc{len(names)}"
            lines.append(f"allocate {call[2]}")
        elif call[0] == "upload":
            (buffer, offset), data = call[1], call[2]
            lines.append(f"upload {names.get(buffer, buffer)} {offset} {data.hex()}")
        else:
            args = " ".join(f"{names.get(buf, buf)}:{off}" for buf, off in call[3])
            lines.append(f"launch {call[1]} {call[2]} {args}")
    return lines


def _problem(**over):
    p = dict(tiling_key=1, batch=2, num_heads=4, num_kv_heads=2, seq_q=40, seq_kv=70, head_dim=32,
             head_dim_v=32, q_layout=0, kv_layout=0, out_layout=0, out_dtype=0, in_dtype=0,
             mask_mode=1, scale=0.17, beta=-1.0, q_block=32, kv_block=32, core_num=20)
    p.update(over)
    return p


CALLS = {
    # pasa: the shift-matrix upload and the cube-only preprocessing; 16 tasks on 5 AI Cores
    "pasa-gqa-causal-5-cores": (_problem(core_num=5), dict(q_lens=[40, 17], kv_lens=[70, 33],
                                                            next_tokens=[30, 16])),
    # pasa-exact: the MIX preprocessing; BSND in, BNSD out; the cores exceed the tasks
    "pasa-exact-bsnd": (_problem(tiling_key=2, beta=1.0, q_layout=1, kv_layout=1, mask_mode=0,
                                 q_block=64, kv_block=64, core_num=24),
                        dict(q_lens=[40, 40], kv_lens=[70, 70], next_tokens=[0, 0])),
    # fa-fp32 with bf16 in and out: no preprocessing
    "fa-fp32-bf16": (_problem(tiling_key=0, beta=0.0, in_dtype=1, out_dtype=1, out_layout=1,
                              batch=1, core_num=20),
                     dict(q_lens=[40], kv_lens=[64], next_tokens=[0])),
    # paged KV: pasa-exact preprocesses each physical block (prefill); in decode with stacked GQA
    # heads it shifts the scores instead (no preprocessing, no K' slot table), as pasa does, whose
    # score map is uploaded in place of the shifting matrix
    "pasa-exact-paged-prefill": (_problem(tiling_key=2, beta=1.0, seq_kv=64, mask_mode=0, paged=1,
                                          block_size=64, table_stride=3, num_blocks=6, kv_block=32),
                                 dict(q_lens=[40, 17], kv_lens=[150, 64], next_tokens=[0, 0])),
    "pasa-exact-paged-decode": (_problem(tiling_key=2, beta=1.0, seq_q=1, seq_kv=64, mask_mode=0, paged=1,
                                         block_size=64, table_stride=3, num_blocks=6, kv_block=32),
                                dict(q_lens=[1, 1], kv_lens=[150, 64], next_tokens=[0, 0])),
    "pasa-decode-score-map": (_problem(seq_q=1, mask_mode=0), dict(q_lens=[1, 1], kv_lens=[70, 33])),
    # an explicit mask per batch and a band with both bounds (sparse mode 4)
    "pasa-mask-band": (_problem(mask_mode=2, has_mask=1, mask_row_stride=70, mask_batch_stride=40 * 70),
                       dict(q_lens=[40, 17], kv_lens=[70, 33], next_tokens=[30, 16], pre_tokens=[20, 5])),
    # learnable sinks: one more argument of the attention kernel
    "pasa-exact-sinks": (_problem(tiling_key=2, beta=1.0, has_sink=1),
                         dict(q_lens=[40, 17], kv_lens=[70, 33], next_tokens=[30, 16])),
    # the key preprocessing in a launch of its own (forced; by default the attention launch runs it)
    "pasa-prep-launch": (_problem(prep_launch=1), dict(q_lens=[40, 17], kv_lens=[70, 33], next_tokens=[30, 16])),
    # checked decode with split kv: the attention launch merges and repairs, or (forced) the merge
    # launch and the repair's second attention launch follow it
    "pasa-exact-decode-split-checked": (_problem(tiling_key=2, beta=1.0, seq_q=1, seq_kv=1024, mask_mode=0,
                                                 overflow_check=1, resolution_limit=512.0),
                                        dict(q_lens=[1, 1], kv_lens=[1024, 700], next_tokens=[0, 0])),
    "pasa-decode-split-merge-launch": (_problem(seq_q=1, seq_kv=1024, mask_mode=0, overflow_check=1,
                                                resolution_limit=512.0, merge_launch=1),
                                       dict(q_lens=[1, 1], kv_lens=[1024, 700], next_tokens=[0, 0])),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_acl_runtime_makes_the_emulated_runtimes_calls(name, recorder):
    params, lens = CALLS[name]
    acl = _acl_calls(recorder, params, lens)
    emulated = _emulated_calls(params, lens)
    assert [line.split()[0] for line in acl] == [line.split()[0] for line in emulated]
    for a, e in zip(acl, emulated):
        assert a == e
    launches = [line.split()[:3] for line in acl if line.startswith("launch")]
    # a task: one query tile of a batch, of one head or of the heads of a kv group stacked
    group, tasks = params["num_heads"] // params["num_kv_heads"], 0
    for q in lens["q_lens"]:
        pitch = min(params["q_block"], q)
        heads = min(group, params["q_block"] // pitch)
        tasks += params["num_kv_heads"] * -(-group // heads) * -(-q // pitch)
    # the key preprocessing (not in decode, where the attention kernel shifts the scores): a task
    # per key block (paged: per table entry's block) and kv head, at the start of the attention
    # launch, which takes as many cores, unless forced into a launch of its own
    key_blocks = params["batch"] * (params["table_stride"] * params["block_size"] // params["kv_block"]
                                    if params.get("paged") else -(-params["seq_kv"] // params["kv_block"]))
    prep_cores = min(params["core_num"], key_blocks * params["num_kv_heads"])
    prepares = params["tiling_key"] != 0 and params["seq_q"] != 1
    own_launch = prepares and params.get("prep_launch", 0)
    expected_prep = [{1: "pasa_shift_keys", 2: "pasa_center_keys"}[params["tiling_key"]]] if own_launch else []
    # split kv (decode, few tasks): the merge, and a checked call's repair, at the attention launch's
    # end, or forced into launches of their own after it
    splits = emu.tiling(dict(params), {n: np.asarray(x, np.int32) for n, x in lens.items()})["kv_splits"]
    after = []
    if splits > 1 and params.get("merge_launch"):
        after = ["pasa_merge_splits"] + (["pasa_attention"] if params.get("overflow_check") else [])
    assert [kernel for _, kernel, _ in launches] == expected_prep + ["pasa_attention"] + after
    attention_cores = max(tasks, prep_cores) if prepares and not own_launch else tasks * splits
    attention = launches[len(expected_prep)]
    assert int(attention[2]) == min(params["core_num"], attention_cores)
    assert all(0 < int(block_dim) <= params["core_num"] for *_, block_dim in launches)


# --------------------------------------------------------------------------- on an NPU


def test_golden_matrix_runs_the_npu_backend_on_an_npu():
    from _support import BACKEND_DEVICES, npu_absent_reason
    reason = npu_absent_reason()
    if reason is not None:
        pytest.skip(f"backend 'npu' runs only on an Ascend NPU, where tests/_support.py adds it to "
                    f"the golden matrix; here {reason}")
    assert ("npu", "npu") in BACKEND_DEVICES


def test_npu_graph_capture_replays_the_eager_result():
    """The call has no host synchronisation: it can be captured in an NPU graph, and a replay
    on new inputs gives what the eager call gives."""
    from _support import npu_absent_reason
    reason = npu_absent_reason()
    if reason is not None:
        pytest.skip(f"NPU graph capture needs an Ascend NPU; here {reason}")
    import torch
    import pasa_npu

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 96, 64, generator=gen).half().npu() for _ in range(3))
    kw = dict(num_heads=4, input_layout="BNSD", scale=0.125, softmax_lse_flag=True,
              sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask("npu"))
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):  # warm-up outside the capture: plans and allocator pools
        pasa_npu.fused_attention(q, k, v, **kw)
    torch.npu.current_stream().wait_stream(side)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        out, lse = pasa_npu.fused_attention(q, k, v, **kw)
    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, generator=gen).half())
    graph.replay()
    want_out, want_lse = pasa_npu.fused_attention(q, k, v, **kw)
    torch.npu.synchronize()
    assert torch.equal(out.cpu(), want_out.cpu()) and torch.equal(lse.cpu(), want_lse.cpu())
