// Kernel launch on the simulator: each core of each AI Core is a process (the CPU-debug build
// keeps per-core state in globals: the core type, the block index, the TPipe, the local
// memories), GM is memory shared by all of them, and the cross-core flags live there too.
//
// Contract.
// * SharedAlloc(bytes): 512-byte aligned GM, shared with the cores of later launches.
// * Launch(blockDim, cores, fn): runs fn() on `cores` = kMix (AIC + 2 AIV per AI Core, GetBlockIdx
//   of an AIV = 2 * block + sub-block), kAiv or kAic, every core at once; returns when all have
//   finished; throws std::runtime_error naming the first core that failed (its message is on
//   stderr) or that waited on a cross-core flag for `timeoutSeconds` (a deadlock).
// * ffts_cross_core_sync(pipe, 1 | mode << 4 | flag << 8) and wait_flag_dev(flag): each core
//   has a counter per flag; a wait takes one count, waiting until there is one. Mode 0: every
//   core of the caller's type counts once all of them have set; mode 1: both AIVs of an AI Core
//   count once both have set; mode 2: an AIC's set counts for both AIVs of its AI Core, the AIC
//   counts once both AIVs have set.
// * Each count carries the time the set fired on the setting core's timeline (the later of the
//   sets it stands for); the wait hands it to the waiting core's timing (sim_issue.h).
// * LastReports(): per core of the last launch (slot 3 b + 0 AIC, 1 AIV0, 2 AIV1), its timing
//   report (CoreReport::ran 0 for a core that did not run).
#ifndef PASA_SIM_LAUNCH_H
#define PASA_SIM_LAUNCH_H

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "include/stub_def.h"
#include "sim_core.h"
#include "sim_issue.h"

namespace pasa_sim {

constexpr uint32_t kMaxBlocks = 64;
constexpr uint32_t kFlags = 16;
constexpr uint32_t kRing = 32;  // sets of one flag a core may hold before waiting on them
enum Cores : int { kMix = 0, kAiv = 1, kAic = 2 };

struct CrossCore {
    pthread_mutex_t lock;
    uint32_t blockDim;
    int cores;
    uint32_t counter[kMaxBlocks * 3][kFlags];     // per core: 3 b + (0 AIC, 1 AIV0, 2 AIV1)
    uint32_t aivSets[kMaxBlocks][kFlags][2];       // mode 2, AIV -> AIC
    uint32_t aivToAic[kMaxBlocks][kFlags];
    uint32_t pairSets[kMaxBlocks][kFlags][2];      // mode 1
    uint32_t pairDone[kMaxBlocks][kFlags];
    uint32_t allSets[2][kFlags];                   // mode 0, per core type
    uint32_t allDone[2][kFlags];
    uint32_t posted[kMaxBlocks * 3][kFlags];       // counts ever posted to each core
    double times[kMaxBlocks * 3][kFlags][kRing];   // the time each posted count fired
    double aivSetTimes[kMaxBlocks][kFlags][2][kRing];
    double pairSetTimes[kMaxBlocks][kFlags][2][kRing];
    double allLatest[2][kFlags];                   // mode 0: the latest set of the group under way
    CoreReport report[kMaxBlocks * 3];
};

struct LaunchContext {
    CrossCore* cross = nullptr;
    int slot = -1;  // this process's core: 3 * block + (0 AIC, 1 AIV0, 2 AIV1)
    double timeoutSeconds = 60.0;
};

inline LaunchContext& Context()
{
    static LaunchContext c;
    return c;
}

inline void* MapShared(size_t bytes)
{
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("pasa-sim: cannot map shared memory");
    return p;
}

inline void* SharedAlloc(size_t bytes)
{
    static uint8_t* arena = nullptr;
    static size_t used = 0;
    constexpr size_t kArena = size_t(4) << 30;
    if (arena == nullptr) arena = static_cast<uint8_t*>(MapShared(kArena));
    const size_t at = (used + 511) / 512 * 512;
    if (at + bytes > kArena) throw std::runtime_error("pasa-sim: shared GM exhausted");
    used = at + bytes;
    return arena + at;
}

inline double Now()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// One count of `flag` for core `slot`, fired at `at`.
inline void Post(CrossCore& x, uint32_t slot, uint32_t flag, double at)
{
    if (x.counter[slot][flag] >= kRing) Fail("core %u holds %u unconsumed sets of cross-core flag %u", slot, kRing, flag);
    x.times[slot][flag][x.posted[slot][flag] % kRing] = at;
    x.posted[slot][flag]++;
    x.counter[slot][flag]++;
}

inline void CrossSet(uint32_t mode, uint32_t flag, double at)
{
    LaunchContext& c = Context();
    if (c.cross == nullptr || c.slot < 0) Fail("cross-core set outside a launch");
    CrossCore& x = *c.cross;
    const uint32_t block = c.slot / 3, sub = c.slot % 3;
    flag &= kFlags - 1;
    Trace("cross-set mode=%u flag=%u core=%d", mode, flag, c.slot);
    pthread_mutex_lock(&x.lock);
    // Both AIVs' k-th sets stand for one count: it fires with the later of them.
    auto pair = [&](uint32_t* sets, double (*times)[kRing], uint32_t* done, auto&& post) {
        if (sets[sub - 1] - *done >= kRing) Fail("an AIV ran %u cross-core sets of flag %u ahead of its pair", kRing, flag);
        times[sub - 1][sets[sub - 1] % kRing] = at;
        sets[sub - 1]++;
        while (sets[0] > *done && sets[1] > *done) {
            const uint32_t k = *done % kRing;
            post(std::max(times[0][k], times[1][k]));
            (*done)++;
        }
    };
    if (mode == 2) {
        if (sub == 0) {
            Post(x, 3 * block + 1, flag, at);
            Post(x, 3 * block + 2, flag, at);
        } else {
            pair(x.aivSets[block][flag], x.aivSetTimes[block][flag], &x.aivToAic[block][flag],
                 [&](double t) { Post(x, 3 * block, flag, t); });
        }
    } else if (mode == 1) {
        if (sub == 0) Fail("cross-core mode 1 set on an AIC");
        pair(x.pairSets[block][flag], x.pairSetTimes[block][flag], &x.pairDone[block][flag], [&](double t) {
            Post(x, 3 * block + 1, flag, t);
            Post(x, 3 * block + 2, flag, t);
        });
    } else if (mode == 0) {
        const uint32_t type = sub == 0 ? 0 : 1;
        const uint32_t cores = type == 0 ? x.blockDim : (x.cores == kMix ? 2 * x.blockDim : x.blockDim);
        x.allSets[type][flag]++;
        x.allLatest[type][flag] = std::max(x.allLatest[type][flag], at);
        while (x.allSets[type][flag] >= (x.allDone[type][flag] + 1) * cores) {
            x.allDone[type][flag]++;
            const double t = x.allLatest[type][flag];
            x.allLatest[type][flag] = 0;
            for (uint32_t b = 0; b < x.blockDim; ++b) {
                if (type == 0) Post(x, 3 * b, flag, t);
                else if (x.cores == kMix) { Post(x, 3 * b + 1, flag, t); Post(x, 3 * b + 2, flag, t); }
                else Post(x, 3 * b + 1, flag, t);
            }
        }
    } else {
        Fail("cross-core sync mode %u", mode);
    }
    pthread_mutex_unlock(&x.lock);
}

inline void CrossWait(uint32_t flag)
{
    LaunchContext& c = Context();
    if (c.cross == nullptr || c.slot < 0) Fail("cross-core wait outside a launch");
    CrossCore& x = *c.cross;
    flag &= kFlags - 1;
    const double start = Now();
    for (uint64_t spin = 0;; ++spin) {
        pthread_mutex_lock(&x.lock);
        uint32_t& n = x.counter[c.slot][flag];
        if (n > 0) {
            const double at = x.times[c.slot][flag][(x.posted[c.slot][flag] - n) % kRing];
            --n;
            Trace("cross-wait flag=%u core=%d", flag, c.slot);
            pthread_mutex_unlock(&x.lock);
            PipesCrossWait(at);
            return;
        }
        pthread_mutex_unlock(&x.lock);
        if (spin > 64) {
            timespec t{0, 20000};
            nanosleep(&t, nullptr);
        } else {
            sched_yield();
        }
        if (Now() - start > c.timeoutSeconds) {
            Fail("core %d (AI Core %d, %s) waited %.0f s on cross-core flag %u: deadlock", c.slot, c.slot / 3,
                 c.slot % 3 == 0 ? "AIC" : (c.slot % 3 == 1 ? "AIV0" : "AIV1"), c.timeoutSeconds, flag);
        }
    }
}

inline std::vector<CoreReport>& LastReports()
{
    static std::vector<CoreReport> r;
    return r;
}

// fn() on every core of `blockDim` AI Cores, each in a process of its own (see the contract).
inline void Launch(uint32_t blockDim, int cores, const std::function<void()>& fn)
{
    if (blockDim == 0 || blockDim > kMaxBlocks) throw std::runtime_error("pasa-sim: blockDim out of range");
    static CrossCore* cross = static_cast<CrossCore*>(MapShared(sizeof(CrossCore)));
    std::memset(static_cast<void*>(cross), 0, sizeof(CrossCore));
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&cross->lock, &attr);
    cross->blockDim = blockDim;
    cross->cores = cores;
    std::fflush(nullptr);
    std::vector<std::pair<pid_t, int>> children;
    for (uint32_t b = 0; b < blockDim; ++b) {
        for (int sub = 0; sub < 3; ++sub) {
            if ((cores == kAiv && sub != 1) || (cores == kAic && sub != 0)) continue;
            const pid_t pid = fork();
            if (pid < 0) throw std::runtime_error("pasa-sim: fork failed");
            if (pid == 0) {
                std::setvbuf(stdout, nullptr, _IONBF, 0);  // the headers' messages survive an abort
                Context().cross = cross;
                Context().slot = static_cast<int>(3 * b + sub);
                g_coreType = sub == 0 ? AscendC::AIC_TYPE : AscendC::AIV_TYPE;
                block_idx = b;
                block_num = blockDim;
                sub_block_idx = sub == 0 ? 0 : sub - 1;
                g_taskRation = cores == kMix ? 2 : 1;
                ResetState();
                StaleLocalMemories();
                fn();
                cross->report[3 * b + sub] = Report();
                std::fflush(nullptr);
                _exit(0);
            }
            children.emplace_back(pid, static_cast<int>(3 * b + sub));
        }
    }
    std::string failure;
    for (size_t left = children.size(); left > 0; --left) {
        int status = 0;
        const pid_t pid = wait(&status);
        if (pid < 0) break;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
        if (failure.empty()) {
            for (const auto& [p, slot] : children) {
                if (p != pid) continue;
                failure = "pasa-sim: core " + std::to_string(slot) + " (AI Core " + std::to_string(slot / 3) + ", " +
                          (slot % 3 == 0 ? "AIC" : (slot % 3 == 1 ? "AIV0" : "AIV1")) + ") failed";
            }
            for (const auto& [p, slot] : children) kill(p, SIGKILL);  // the rest may wait on it forever
        }
    }
    if (!failure.empty()) throw std::runtime_error(failure);
    LastReports().assign(cross->report, cross->report + 3 * blockDim);
}

}  // namespace pasa_sim

template <typename P, typename C>
inline void ffts_cross_core_sync(P pipe, C config)
{
    const uint64_t v = static_cast<uint64_t>(config);
    pasa_sim::CrossSet((v >> 4) & 3, (v >> 8) & 0xf, pasa_sim::PipesCrossSet(static_cast<int>(pipe)));
}

template <typename F>
inline void wait_flag_dev(F flag)
{
    pasa_sim::CrossWait(static_cast<uint32_t>(flag));
}

#endif
