"""pasa-bench --host: every argument form runs with the kernel replaced by a no-op (and the
kernel restored after), and the table is written; the times themselves are not held here."""
from __future__ import annotations

import json

import pytest

from pasa_npu.fallback.torch import blockwise as torch_blockwise
from pasa_npu.tools import bench, bench_host


def test_every_form_runs_with_a_no_op_kernel(tmp_path, monkeypatch):
    computed = []
    kernel = lambda problem: computed.append(problem)  # noqa: E731
    monkeypatch.setattr(torch_blockwise, "run", kernel)
    with bench_host.no_op_kernel():
        for call, peer in bench_host.forms().values():
            bench_host.eager(call)()
            bench_host.planned(call)()
            peer()
    assert computed == []  # the no-op ran, not the kernel in place before
    assert torch_blockwise.run is kernel  # and that kernel is back, without a repeat
    assert not hasattr(torch_blockwise, "repeat")
    assert bench.main(["--host", "--calls", "3", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "host.json").read_text())
    assert [r["form"] for r in rows] == list(bench_host.forms())
    assert all(r["fused_attention_us"] > 0 and r["plan_run_us"] > 0 and r["sdpa_us"] > 0
               for r in rows)
    assert (tmp_path / "host.md").read_text().count("\n") == 2 + len(rows)


def test_calls_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--host", "--calls", "0", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--calls must be >= 1, got 0" in capsys.readouterr().err
