// Stand-in for the closed tikicpulib header "simt_stub.h": its types are in stub_def.h.
#pragma once
#include "stub_def.h"
