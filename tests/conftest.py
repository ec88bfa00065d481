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

from hypothesis import settings  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
