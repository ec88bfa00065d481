// Hooks of the CPU-debug runtime (the closed tikicpulib), called by the asc-devkit headers
// around buffer and queue operations (TPipe::InitBuffer, AllocTensor, EnQue, DeQue, FreeTensor,
// TBuf::Get) and at TPipe construction (AscendCBufAbsAddr: the base of each local memory).
//
// Contract: they check nothing and change no simulated state; they count calls.
#ifndef PASA_SIM_HOOKS_H
#define PASA_SIM_HOOKS_H

#include "sim_core.h"

namespace pasa_sim {
inline uint64_t& HookCalls()
{
    static thread_local uint64_t n = 0;
    return n;
}
}  // namespace pasa_sim

#define PASA_SIM_HOOK(ret, name) \
    template <typename... A> inline ret name(A...) { ++pasa_sim::HookCalls(); return ret(); }
PASA_SIM_HOOK(void, AscendCBufInit)
PASA_SIM_HOOK(void, AscendCQueCreate)
PASA_SIM_HOOK(int64_t, AscendCBufAlloc)
PASA_SIM_HOOK(void, AscendCBufFree)
PASA_SIM_HOOK(void, AscendCBufEnque)
PASA_SIM_HOOK(void, AscendCBufDeque)
PASA_SIM_HOOK(void, AscendCBufGet)
PASA_SIM_HOOK(int64_t, AscendCBufAbsAddr)
PASA_SIM_HOOK(void, AscendCTBufPoolInit)
PASA_SIM_HOOK(void, AscendCTBufPoolResetCheck)
PASA_SIM_HOOK(void, AscendCUpdateTbufPoolStatus)
PASA_SIM_HOOK(void, AscendCRecordPoolHierarchy)
#undef PASA_SIM_HOOK

#endif
