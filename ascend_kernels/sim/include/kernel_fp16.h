// Stand-in for the closed tikicpulib header "kernel_fp16.h": its types are in stub_def.h.
#pragma once
#include "stub_def.h"
