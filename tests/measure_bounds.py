"""Measure the errors the suite's bounds are set from and write them to tests/measured.json.

    python tests/measure_bounds.py [pytest arguments]
    python tests/measure_bounds.py --from FILE [FILE ...]

runs the measuring tests (by default every test file that records) with PASA_MEASURE
set: each measuring test then records what it measures (tests/_support.py, ``record``)
and holds nothing to the old values. Of each (kind, key), the largest value, rounded up to
three significant digits, goes into tests/measured.json: after a run of every measuring
test it replaces the key's entry; after a run of some (test files or ``-k`` expressions
given), it only raises it, as other tests may measure the same key. Keys a run did not
measure are kept. On a CUDA machine the Triton tests run on the GPU and record "cuda/" keys.

``--from`` takes what runs of pytest with PASA_MEASURE=FILE recorded instead of running
the tests itself (a sharded GPU suite: ``PASA_MEASURE=$PWD/m.jsonl bash .ci/gpu-suite
tests``), and only raises entries. pytest-xdist's ``-n auto`` is used where installed.

The file maps kind -> key -> the largest value recorded. Bounds against the golden are a
stated factor times one of these; the bounds between two implementations of one allocation
(triton-*, ablate) are derived (tests/_bounds.py), and their values are information. Keys
start with where the computation ran (cpu, interpreter, cuda), then what the test names.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
TABLE = HERE / "measured.json"
MEASURING = ["test_golden.py", "test_paper_cases.py", "api/test_properties.py",
             "api/test_fia_v2_sinks.py", "tools/test_compare_report.py",
             "api/test_semantics.py", "api/test_argument_forms.py",
             "fallback/triton/test_triton_tuning.py", "fallback/triton/test_triton_launch.py",
             "fallback/triton/test_triton_host.py", "fallback/gluon/test_gluon_prefill.py",
             "tools/test_ablate.py", "tools/test_compare_file.py",
             "tools/test_compare_capture.py", "test_paged.py", "api/test_overflow.py",
             "ascend_kernels/test_ascendc_emu.py", "ascend_kernels/test_ascendc_emu_serving.py",
             "integrations/test_integration_attention.py",
             "integrations/test_integration_diffusers.py",
             "integrations/test_integration_transformers.py",
             "fallback/torch/test_torch_backward.py"]

def _round_up(value: float) -> float:
    if value <= 0 or not math.isfinite(value):
        return value
    step = 10.0 ** (math.floor(math.log10(value)) - 2)
    return float(f"{math.ceil(value / step * (1 - 1e-12)) * step:.3g}")


def _load() -> dict:
    return json.loads(TABLE.read_text()) if TABLE.exists() else {}


def _largest(lines) -> dict:
    largest: dict = {}
    for line in lines:
        entry = json.loads(line)
        slot = largest.setdefault(entry["kind"], {})
        slot[entry["key"]] = max(slot.get(entry["key"], 0.0), entry["value"])
    return largest


def _measure(targets: list[str]) -> tuple[dict, int]:
    parallel = ["-n", "auto"] if importlib.util.find_spec("xdist") else []
    with tempfile.TemporaryDirectory() as tmp:
        log = pathlib.Path(tmp) / "measured.jsonl"
        log.touch()
        env = dict(os.environ, PASA_MEASURE=str(log))
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", *parallel,
                              "-p", "no:cacheprovider", *targets], env=env, cwd=HERE.parent)
        return _largest(log.read_text().splitlines()), run.returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["--from"]:
        largest = _largest(line for name in argv[1:] for line in open(name))
        status = 0
    else:
        largest, status = _measure(argv or [str(HERE / name) for name in MEASURING])
    table = _load()
    for kind, values in largest.items():
        old = table.setdefault(kind, {})
        for key, value in values.items():
            old[key] = _round_up(value) if not argv else max(old.get(key, 0.0), _round_up(value))
    table = {kind: dict(sorted(values.items())) for kind, values in sorted(table.items())}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    counts = ", ".join(f"{kind} {len(v)}" for kind, v in sorted(largest.items()))
    print(f"measured ({counts}); written to {TABLE}")
    if status not in (0, 1):
        print(f"pytest ended with status {status}", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
