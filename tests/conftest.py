import os
import sys

# Without a GPU, run the Triton kernels through Triton's interpreter on CPU tensors (small
# shapes). Must be set before any kernel is defined.
if os.environ.get("TRITON_INTERPRET") is None:
    try:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:
        pass

# Under pytest-xdist (the README's `-n auto`), each worker's torch takes its share of the
# cores rather than all of them: the workers already keep every core busy.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    import torch
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // _workers))

from hypothesis import settings  # noqa: E402

# The tests are laid out like the source (api/, fallback/triton/, ascend_kernels/, tools/...)
# and import the shared helpers of this folder (_support, _oracle, ...) and, some, what another
# test module defines (test_golden's cases, test_ascendc_emu's bounds) as top-level modules:
# this folder and every folder of tests go on the path, whichever files pytest was given.
# Test modules are not packages, so their basenames stay unique across the folders.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _folder in sorted(dirpath for dirpath, _, files in os.walk(_HERE)
                      if any(f.startswith("test_") and f.endswith(".py") for f in files)
                      and dirpath != _HERE):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)
sys.path.insert(0, _HERE)

if os.environ.get("TRITON_INTERPRET") == "1":
    import _interpreter  # noqa: E402

    _interpreter.install()

settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Every test plans its calls anew: a plan cached by an earlier test's identical call
    would repeat that call's recorded launches (on a GPU) without asking the backend's
    heuristics again, so a test's outcome would depend on the tests before it."""
    import pasa_npu
    pasa_npu.plans.clear()
