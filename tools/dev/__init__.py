"""Development tools, run from a checkout and never installed (setup.py leaves this package
out): the kernel ablations (``python -m pasa_npu.tools.dev.ablate``), the ahead-of-time
compiler of the Triton kernels (``python -m pasa_npu.tools.dev.triton_aot``), the mutation
check of the test suite (``python tools/dev/mutation_check.py``) and the outputs' fingerprints,
which show that a change computes the same bytes (``python -m pasa_npu.tools.dev.output_digest``).
In an editable install ``pasa_npu.tools`` is this checkout's ``tools/``, so
``pasa_npu.tools.dev`` imports from it."""
