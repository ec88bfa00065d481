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

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
