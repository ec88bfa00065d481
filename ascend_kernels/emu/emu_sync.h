// Flags of the AscendC CPU emulation: SetFlag/WaitFlag between the pipes of one core, the
// cross-core flags (mode 2) between an AI Core's cube and vector threads, and SyncAll over
// every core of a launch.
#pragma once

#include "emu_dispatch.h"

namespace AscendC {
namespace emu {

// ------------------------------------------------------------------ intra-core flags
inline bool EventValidOn(const CoreCtx& c, int src, int dst)
{
    auto cubePipe = [](int p) { return p == P_S || p == P_M || p == P_MTE1 || p == P_MTE2 || p == P_MTE3 || p == P_FIX; };
    auto vecPipe = [](int p) { return p == P_S || p == P_V || p == P_MTE2 || p == P_MTE3; };
    return c.type == AIC ? (cubePipe(src) && cubePipe(dst)) : (vecPipe(src) && vecPipe(dst));
}

inline void SetFlagImpl(HardEvent evt, int32_t id)
{
    CoreCtx& c = Core();
    int src, dst;
    EventPipes(evt, src, dst);
    if (src < 0) Fail("SetFlag: invalid HardEvent %d", static_cast<int>(evt));
    if (!EventValidOn(c, src, dst)) Fail("SetFlag<%s_%s>: this event does not exist on an %s core", PipeShort(src), PipeShort(dst), c.type == AIC ? "AIC" : "AIV");
    if (id < 0 || id >= kEventIds) Fail("SetFlag: eventID %d outside [0, 7]", id);
    const int e = static_cast<int>(evt);
    if (c.queueFlag[e][id]) {
        Fail("SetFlag<%s_%s>(%d): a queue holds this event ID with its own flag set (FreeTensor until the next "
             "AllocTensor, EnQue until DeQue); a fixed ID collides with the queues', take one from TPipe::AllocEventID",
             PipeShort(src), PipeShort(dst), id);
    }
    if (c.flagSet[e][id]) {
        Fail("SetFlag<%s_%s>(%d) twice without a WaitFlag in between: undefined behaviour on hardware "
             "(a later PipeBarrier<PIPE_ALL> hangs)", PipeShort(src), PipeShort(dst), id);
    }
    Issue(src);
    c.flagSet[e][id] = true;
    c.flagClock[e][id] = PipeSnapshot(src);
    c.tm.event[e][id] = FlagRaise(src);
}

inline void WaitFlagImpl(HardEvent evt, int32_t id)
{
    CoreCtx& c = Core();
    int src, dst;
    EventPipes(evt, src, dst);
    if (src < 0) Fail("WaitFlag: invalid HardEvent %d", static_cast<int>(evt));
    if (!EventValidOn(c, src, dst)) Fail("WaitFlag<%s_%s>: this event does not exist on an %s core", PipeShort(src), PipeShort(dst), c.type == AIC ? "AIC" : "AIV");
    if (id < 0 || id >= kEventIds) Fail("WaitFlag: eventID %d outside [0, 7]", id);
    const int e = static_cast<int>(evt);
    if (c.queueFlag[e][id]) {
        Fail("WaitFlag<%s_%s>(%d): a queue holds this event ID with its own flag set, and the wait would take it; "
             "take an ID from TPipe::AllocEventID", PipeShort(src), PipeShort(dst), id);
    }
    if (!c.flagSet[e][id]) {
        Fail("WaitFlag<%s_%s>(%d) with no matching SetFlag before it: pipe %s would block forever (timeout on "
             "hardware)", PipeShort(src), PipeShort(dst), id, PipeName(dst));
    }
    c.flagSet[e][id] = false;
    Join(c.seen[dst], c.flagClock[e][id]);
    Issue(dst);
    FlagWait(dst, c.tm.event[e][id], src == P_V || src == P_MTE2 || src == P_MTE3);
}

inline void BarrierAll()
{
    CoreCtx& c = Core();
    Clock all{};
    for (int p = 0; p < kPipes; ++p) Join(all, PipeSnapshot(p));
    for (int p = 0; p < kPipes; ++p) Join(c.seen[p], all);
    const double at = c.tm.End();
    c.tm.scalar = at;
    for (auto& q : c.tm.pipe) q.free = q.done = std::max(q.done, at);
}

// PipeBarrier on one pipe: its next instruction waits until everything before has completed.
inline void BarrierPipe(int pipe)
{
    PipeTimeline& q = Core().tm.pipe[pipe];
    q.free = std::max(q.free, q.done);
}

// ------------------------------------------------------------------ cross-core flags (mode 2)
inline void CrossSet(int mode, int pipe, int flagId)
{
    CoreCtx& c = Core();
    Group& g = *c.group;
    if (mode != 2) Fail("CrossCoreSetFlag<%d>: only mode 2 (AIC <-> both AIVs of one AI Core) is emulated", mode);
    if (!g.mix) Fail("CrossCoreSetFlag<2>: mode 2 needs a MIX kernel with one AIC and two AIVs (KERNEL_TYPE_MIX_AIC_1_2)");
    if (flagId < 0 || flagId >= kCrossFlags) Fail("CrossCoreSetFlag: flagId %d outside [0, 15]", flagId);
    if (pipe == P_S || pipe < 0) Fail("CrossCoreSetFlag: pipe must be one of PIPE_V/M/MTE1/MTE2/MTE3/FIX, got %s", PipeName(pipe));
    Issue(pipe);
    const Clock snap = PipeSnapshot(pipe);
    const double visible = FlagRaise(pipe) + Timing().cross_core_latency_cycles;
    c.stats.cross_core_sets++;
    std::lock_guard<std::mutex> lock(g.mu);
    CrossFlag& f = g.flags[flagId];
    auto bump = [&](int target, const Clock& clk, double at) {
        if (f.count[target] >= kCrossFlagMax) {
            Fail("CrossCoreSetFlag(%d): the counter of %s would exceed 15 (it was set 16 times without a wait); "
                 "the hardware raises an exception", flagId, target == 0 ? "AIC" : (target == 1 ? "AIV0" : "AIV1"));
        }
        f.count[target]++;
        f.clocks[target].push_back(clk);
        f.times[target].push_back(at);
    };
    if (c.type == AIC) {
        bump(1, snap, visible);
        bump(2, snap, visible);
    } else {
        f.aivSets[c.subIdx].push_back(snap);
        f.aivTimes[c.subIdx].push_back(visible);
        if (f.aivSets[c.subIdx].size() > static_cast<size_t>(kCrossFlagMax)) {
            Fail("CrossCoreSetFlag(%d): AIV%d set it 16 times while AIV%d did not; the counter overflows", flagId, c.subIdx, 1 - c.subIdx);
        }
        while (!f.aivSets[0].empty() && !f.aivSets[1].empty()) {
            Clock both = f.aivSets[0].front();
            Join(both, f.aivSets[1].front());
            const double at = std::max(f.aivTimes[0].front(), f.aivTimes[1].front());
            f.aivSets[0].pop_front();
            f.aivSets[1].pop_front();
            f.aivTimes[0].pop_front();
            f.aivTimes[1].pop_front();
            bump(0, both, at);
        }
    }
    g.cv.notify_all();
}

inline void CrossWait(int flagId)
{
    CoreCtx& c = Core();
    Group& g = *c.group;
    if (!g.mix) Fail("CrossCoreWaitFlag: needs a MIX kernel with one AIC and two AIVs (KERNEL_TYPE_MIX_AIC_1_2)");
    if (flagId < 0 || flagId >= kCrossFlags) Fail("CrossCoreWaitFlag: flagId %d outside [0, 15]", flagId);
    c.stats.cross_core_waits++;
    std::unique_lock<std::mutex> lock(g.mu);
    CrossFlag& f = g.flags[flagId];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(g.timeoutSeconds);
    if (f.count[c.slot] == 0) {
        g.blocked++;
        g.waitingOn[c.slot] = "CrossCoreWaitFlag(" + std::to_string(flagId) + ")";
        g.waitingFlag[c.slot] = flagId;
        g.cv.notify_all();
        while (f.count[c.slot] == 0 && !g.aborted) {
            if (g.Deadlocked()) {
                std::string who;
                for (int s = 0; s < kCoresPerGroup; ++s) {
                    if (!g.waitingOn[s].empty()) who += (s == 0 ? " AIC waits " : (s == 1 ? " AIV0 waits " : " AIV1 waits ")) + g.waitingOn[s] + ";";
                }
                g.aborted = true;
                g.abortMessage = "deadlock in AI Core " + std::to_string(c.blockIdx) +
                                 ": every live core waits for a cross-core flag nobody will set:" + who +
                                 " (on hardware this hangs until the task timeout)";
                g.cv.notify_all();
                break;
            }
            if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout && f.count[c.slot] == 0 && !g.aborted) {
                g.aborted = true;
                g.abortMessage = c.name + ": CrossCoreWaitFlag(" + std::to_string(flagId) + ") timed out after " +
                                 std::to_string(g.timeoutSeconds) + " s";
                g.cv.notify_all();
            }
        }
        g.blocked--;
        g.waitingOn[c.slot].clear();
        g.waitingFlag[c.slot] = -1;
        if (g.aborted) throw EmuError(g.abortMessage);
    }
    f.count[c.slot]--;
    const Clock clk = f.clocks[c.slot].front();
    f.clocks[c.slot].pop_front();
    const double at = f.times[c.slot].front();
    f.times[c.slot].pop_front();
    lock.unlock();
    // Atlas A2: the wait blocks every pipe of the waiting core.
    for (int p = 0; p < kPipes; ++p) Join(c.seen[p], clk);
    FlagWait(P_S, at);
}

// ------------------------------------------------------------------ SyncAll
// Every core of the launch waits until all of them have reached it. Timing: each core's pipes
// resume at the latest arrival plus the hops of the hardware barrier (asc-devkit's
// SyncAllImpl: MIX, AIV -> AIC, all AICs, AIC -> AIV; AIV only, one all-core hop), each a
// cross-core flag's latency.
inline void SyncAllCores(bool aivOnly)
{
    CoreCtx& c = Core();
    Group& g = *c.group;
    if (g.mix && aivOnly) Fail("SyncAll<true> in a MIX kernel: the emulation runs SyncAll<false> there (every AIC and AIV)");
    if (!g.mix && !aivOnly) Fail("SyncAll<false> outside a MIX kernel: it waits for AIC and AIV cores the launch does not have");
    if (!g.mix && c.type == AIC) Fail("SyncAll: the emulation runs it on AIV cores or in MIX kernels");
    BarrierAll();
    const double at = c.tm.End();
    Schedule& s = *g.schedule;
    std::unique_lock<std::mutex> lock(s.mu);
    const uint64_t round = s.released;
    s.arrived++;
    s.parked[c.blockIdx]++;
    s.latest = std::max(s.latest, at);
    s.cv.notify_all();
    s.cv.wait(lock, [&] { return s.aborted || (s.released != round && s.running == c.blockIdx); });
    if (s.aborted) throw EmuError(s.abortMessage);
    const double release = s.releaseAt + (g.mix ? 3 : 1) * Timing().cross_core_latency_cycles;
    lock.unlock();
    c.stats.cross_core_waits++;
    c.tm.scalar = std::max(c.tm.scalar, release);
    for (auto& q : c.tm.pipe) q.free = q.done = std::max(q.done, release);
}

}  // namespace emu
}  // namespace AscendC
