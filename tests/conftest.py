import os
import sys

from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
