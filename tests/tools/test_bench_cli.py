"""pasa-bench's options are checked before any work: a bad number, an --out in the way or a
--plot file it cannot draw ends in one argparse error line (exit 2), with no worker started,
nothing timed and no folder made; and every option's help says what it does and its default."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from pasa_npu.tools import bench, bench_distributed, bench_host

GLOO = ["--distributed", "--backend", "gloo", "--seqs", "256", "--heads", "4", "--kv-heads",
        "2", "--head-dim", "32", "--runs", "1", "--quiet"]


@pytest.fixture
def no_work(monkeypatch):
    """Any timing or worker start fails the test: the error must come first."""
    def work(*args, **kwargs):
        raise AssertionError("work started before the options were checked")
    monkeypatch.setattr(bench_host, "forms", work)
    monkeypatch.setattr(bench_distributed.mp, "spawn", work)
    monkeypatch.setattr(bench, "_run", work)
    monkeypatch.setattr(bench, "plot", work)


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("mode", [[], ["--host", "--calls", "5"], GLOO])
@pytest.mark.parametrize("out", ["x.txt", "x.txt/sub"])
def test_out_in_the_way_of_a_file_is_refused_first(mode, out, tmp_path, capsys, no_work):
    (tmp_path / "x.txt").write_text("")
    line = _refused(mode + ["--out", str(tmp_path / out)], capsys)
    why = ("expected a folder, got an existing file" if out == "x.txt"
           else f"cannot create it: {tmp_path / 'x.txt'} is a file")
    assert line.endswith(f"argument --out: {why}")


def _bench_json(rows):
    return {"device": "test GPU", "algorithms": ["pasa"], "decode_algorithms": ["pasa"],
            "copy_gbs": 3000.0, "rows": rows}


@pytest.mark.parametrize("content, lacks", [
    ({"gpus": 2, "rows": [{"engine": "ring", "local": "pasa", "seq": 256, "causal": False,
                           "gpus": 1, "ms": 1.0, "local_ms": 1.0, "tflops_per_gpu": 1.0}]},
     "it is pasa-bench --distributed's distributed.json, which has no plot; its table is "
     "distributed.md"),
    ([{"form": "prefill BNSD", "fused_attention_us": 1.0}],
     "it is pasa-bench --host's host.json, which has no plot; its table is host.md"),
    ({}, "no 'device', 'algorithms', 'decode_algorithms', 'copy_gbs', 'rows'"),
    ([1, 2], "it holds a JSON array, not an object"),
    ({"rows": []}, "no 'device', 'algorithms', 'decode_algorithms', 'copy_gbs'"),
    (_bench_json([]), "no prefill or decode rows"),
    (_bench_json([{"kind": "prefill", "d": 128}]), "row 0 (prefill) lacks one of d, s, causal"),
    (_bench_json([{"engine": "ring"}]), "row 0 is not a prefill or decode row"),
])
def test_plot_of_a_file_that_is_no_bench_json_is_refused(content, lacks, tmp_path, capsys,
                                                         no_work):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(content))
    out = tmp_path / "out"
    assert bench.main(["--plot", str(saved), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"pasa-bench: error: {saved} is not a pasa-bench bench.json ({lacks})\n"
    assert not out.exists()


@pytest.mark.parametrize("extra, message", [
    (["--runs", "0"], "argument --runs: --runs must be >= 1, got 0"),
    (["--head-dim", "0"], "argument --head-dim: --head-dim must be >= 1, got 0"),
    (["--seqs", "256", "0"], "argument --seqs: --seqs must be >= 1, got 0"),
    (["--heads", "x"], "argument --heads: --heads must be an integer, got 'x'"),
    (["--gpus", "0"], "argument --gpus: --gpus must be >= 1, got 0"),
    (["--gpus", "1"], "--gpus must be 2 or more, got 1"),
    (["--kv-heads", "3"], "--heads must be a multiple of --kv-heads (3), got 4"),
    (["--heads", "4", "--kv-heads", "1"], "--kv-heads must be a multiple of the ranks (2), "
                                          "among which yunchang-ulysses splits them, got 1"),
    (["--seqs", "256", "255", "3"], "--seqs must be multiples of the ranks (2), got 255 3"),
])
def test_distributed_numbers_are_checked_before_any_worker(extra, message, capsys, no_work):
    assert _refused(GLOO + extra, capsys) == f"pasa-bench --distributed: error: {message}"


@pytest.mark.parametrize("visible, extra, message", [
    (0, [], "no CUDA device is visible here for --backend nccl (the default); --backend gloo "
            "runs the ranks on the CPU"),
    (1, [], "--distributed needs 2 or more GPUs; 1 CUDA device visible"),
    (8, ["--kv-heads", "4"], "--kv-heads must be a multiple of the ranks (8)"),
])
def test_distributed_on_the_gpus_here_says_what_is_missing(visible, extra, message,
                                                          monkeypatch, capsys, no_work):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert message in _refused(["--distributed"] + extra, capsys)


@pytest.mark.parametrize("visible, kv_heads", [(2, 4), (4, 4), (8, 8)])
def test_distributed_default_kv_heads_split_over_the_ranks(visible, kv_heads, monkeypatch,
                                                           tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    started = []

    def spawn(worker, args, nprocs, join):
        started.append(args[1]["kv_heads"])
        raise RuntimeError("stop after the first start")
    monkeypatch.setattr(bench_distributed.mp, "spawn", spawn)
    with pytest.raises(RuntimeError, match="stop after the first start"):
        bench_distributed.run(["--distributed", "--out", str(tmp_path)])
    assert started == [kv_heads]


@pytest.mark.parametrize("extra, message", [
    (["--dims", "0"], "argument --dims: --dims must be >= 1, got 0"),
    (["--dims", "128", "4096"], "--dims must be at most 2048 (heads x head dim), got 4096"),
    (["--seqs", "0"], "argument --seqs: --seqs must be >= 1, got 0"),
    (["--no-prefill", "--no-decode"], "--no-prefill with --no-decode leaves no case to time"),
    (["--no-prefill", "--quick"], "--no-prefill with --quick leaves no case to time"),
])
def test_gpu_bench_options_are_checked_before_any_work(extra, message, tmp_path, capsys,
                                                       no_work):
    out = tmp_path / "out"
    assert _refused(extra + ["--out", str(out)], capsys) == f"pasa-bench: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("module", [bench, bench_host, bench_distributed])
def test_every_option_says_what_it_does_and_its_default_once(module):
    for action in module.make_parser()._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        assert action.help, action.option_strings
        if action.default not in (None, False):
            assert action.help.count("default") == 1, (action.option_strings, action.help)
