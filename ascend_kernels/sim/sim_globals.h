// Definitions the CPU-debug runtime (the closed tikicpulib library) provides: the launch
// globals, AscendC::g_isAtomic, the process lock, and the parameter checkers
// AscendC::check::*Impl (generated from their declarations by tools/sim_build.py; each
// accepts); and pasa_sim::LocalMemories (sim_pipes.h), which needs the asc-devkit's buffers.
// Include in exactly one translation unit, after "kernel_operator.h".
#ifndef PASA_SIM_GLOBALS_H
#define PASA_SIM_GLOBALS_H

#include <pthread.h>

int32_t g_coreType = AscendC::AIV;
int64_t block_idx = 0;
int64_t block_num = 1;
int64_t sub_block_idx = 0;
uint64_t g_fixpipeNdNzParam = 0;
int64_t g_taskRation = 1;

namespace AscendC {
bool g_isVdeq = false;
bool g_isAtomic = false;
ProcessLock* ProcessLock::processLock = nullptr;
ProcessLock::ProcessLock() { pthread_rwlock_init(&lock, nullptr); }
ProcessLock::~ProcessLock() { pthread_rwlock_destroy(&lock); }
ProcessLock* ProcessLock::CreateLock() { return new ProcessLock(); }
void ProcessLock::FreeLock() { delete processLock; processLock = nullptr; }
int ProcessLock::Read() { return pthread_rwlock_rdlock(&lock); }
int ProcessLock::Write() { return pthread_rwlock_wrlock(&lock); }
int ProcessLock::Unlock() { return pthread_rwlock_unlock(&lock); }
void ProcessLock::UnInit() {}
}  // namespace AscendC

#include "sim_checks_gen.h"

void pasa_sim::LocalMemories(uint8_t* base[kMems], uint64_t size[kMems])
{
    using AscendC::Hardware;
    AscendC::ConstDefiner& d = AscendC::ConstDefiner::Instance();
    const std::pair<int, Hardware> mems[] = {{kUB, Hardware::UB}, {kL1, Hardware::L1}, {kL0A, Hardware::L0A},
                                             {kL0B, Hardware::L0B}, {kL0C, Hardware::L0C}};
    for (const auto& [mem, hw] : mems) {
        base[mem] = d.hardwareCpuBufferMap.at(hw);
        size[mem] = d.bufferInitLen.at(hw);
    }
}

#endif
