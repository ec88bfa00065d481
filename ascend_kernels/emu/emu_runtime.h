// Runtime of the AscendC CPU emulation: cores as threads, their local memories, the
// checks the hardware imposes (capacity, alignment, pipe hazards, flags, deadlock) and the
// traffic counters. Everything here is emulation machinery, not AscendC API.
//
// Execution model. A launch runs its blocks one after another (Schedule); a SyncAll parks a
// block's cores until every block has reached it, then the blocks take their turns again. A
// block of a MIX 1:2 kernel is one AI Core: one cube thread (AIC) and two vector threads
// (AIV0, AIV1) that really run concurrently and meet only through GM, the cross-core flags
// and SyncAll. Each core executes its instructions synchronously, in program order.
//
// Hazard model. On hardware every core has independent pipes (S, V, M, MTE1, MTE2, MTE3,
// FIX); an instruction on one pipe may overtake an earlier instruction on another. The
// emulation keeps a vector clock per pipe: pipe P "has seen" instruction #n of pipe Q once
// a SetFlag<Q_P>/WaitFlag<Q_P> pair (or a queue EnQue/DeQue, FreeTensor/AllocTensor,
// PipeBarrier<PIPE_ALL>, or a cross-core flag) orders them. Every access to local memory
// (per 32-byte block) and to the GM workspace checks that the last conflicting access on
// another pipe has been seen; if not, it is a race on hardware and the emulation raises.
// Pairs the Atlas A2 toolchain synchronises by itself (cce-auto-sync on AIV: V with S,
// MTE2 with S, MTE3 with S) and accesses on the same pipe are not checked.
#pragma once

// The pieces, each including the one before: emu_hardware.h, emu_cores.h, emu_dispatch.h,
// emu_sync.h; this header adds the launch.

#include "emu_sync.h"

namespace AscendC {
namespace emu {

// ------------------------------------------------------------------ launch
struct LaunchOptions {
    int blockDim = 1;
    KernelMetaType type = KERNEL_TYPE_MIX_AIC_1_2;
    double timeoutSeconds = 20.0;
    TimingParams timing;  // the timing model's parameters (all of them must be set)
};

inline thread_local KernelMetaType tls_launch_type = KERNEL_TYPE_MAX;

inline void CheckDeclaredKernelType(KernelMetaType declared)
{
    if (declared != tls_launch_type) {
        Fail("KERNEL_TASK_TYPE_DEFAULT declares kernel type %d but the kernel was launched as type %d",
             static_cast<int>(declared), static_cast<int>(tls_launch_type));
    }
}

inline void CheckCoreClean(CoreCtx& c)
{
    for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
        for (int id = 0; id < kEventIds; ++id) {
            if (c.flagSet[e][id]) {
                int s, d;
                EventPipes(static_cast<HardEvent>(e), s, d);
                Fail("kernel ended with SetFlag<%s_%s>(%d) never waited for", PipeShort(s), PipeShort(d), id);
            }
        }
    }
}

// The first error of some cores (one that is not "aborted because ..." where there is one).
inline std::string FirstError(const std::vector<std::string>& errors)
{
    for (auto& e : errors) {
        if (!e.empty() && e.rfind("aborted because", 0) != 0) return e;
    }
    for (auto& e : errors) {
        if (!e.empty()) return e;
    }
    return std::string();
}

// Every cross-core flag of an AI Core must end with its counters at zero.
inline void CheckFlagsDrained(const Group& group, int block)
{
    for (int f = 0; f < kCrossFlags; ++f) {
        const CrossFlag& fl = group.flags[f];
        for (int s = 0; s < kCoresPerGroup; ++s) {
            if (fl.count[s] != 0) {
                throw EmuError("AI Core " + std::to_string(block) + ": CrossCoreSetFlag(" + std::to_string(f) +
                               ") was set " + std::to_string(fl.count[s]) + " more time(s) than " +
                               (s == 0 ? "AIC" : (s == 1 ? "AIV0" : "AIV1")) + " waited for it");
            }
        }
        if (!fl.aivSets[0].empty() || !fl.aivSets[1].empty()) {
            throw EmuError("AI Core " + std::to_string(block) + ": CrossCoreSetFlag(" + std::to_string(f) +
                           ") was set by only one of the two AIVs (mode 2 needs both)");
        }
    }
}

// The cores of AI Core `block`: the AIC and/or the AIVs the kernel type has.
inline std::vector<std::unique_ptr<CoreCtx>> MakeCores(const LaunchOptions& opt, GmRegistry& gm, Group& group, int block)
{
    std::vector<std::unique_ptr<CoreCtx>> cores;
    const bool mix = opt.type == KERNEL_TYPE_MIX_AIC_1_2;
    auto addCore = [&](int type, int sub, int slot, const char* name) {
        auto c = std::make_unique<CoreCtx>();
        c->type = type;
        c->blockIdx = block;
        c->subIdx = sub;
        c->slot = slot;
        c->blockDim = opt.blockDim;
        c->group = &group;
        c->gm = &gm;
        c->name = std::string(name) + " of AI Core " + std::to_string(block);
        // A launch finds in its buffers what the last one left, never zeros: NaN here, so that a
        // kernel which uses what it did not write shows it.
        for (Hardware h : {Hardware::UB, Hardware::L1, Hardware::L0A, Hardware::L0B, Hardware::L0C}) {
            if (c->Has(h)) {
                c->mem[static_cast<int>(h)].assign(HardwareCapacity(h), kUnwrittenByte);
                c->shadow[static_cast<int>(h)].resize(HardwareCapacity(h) / kBlockBytes);
            }
        }
        cores.push_back(std::move(c));
    };
    if (mix || opt.type == KERNEL_TYPE_AIC_ONLY) addCore(AIC, 0, 0, "AIC");
    if (mix) {
        addCore(AIV, 0, 1, "AIV0");
        addCore(AIV, 1, 2, "AIV1");
    } else if (opt.type == KERNEL_TYPE_AIV_ONLY) {
        addCore(AIV, 0, 1, "AIV");
    }
    return cores;
}

// Starts the threads of AI Core `block`'s cores: each waits for its AI Core's turn
// (Schedule), runs the kernel and records its failure in `errors`.
inline void StartAiCore(const LaunchOptions& opt, Schedule& sched, Group& group,
                        std::vector<std::unique_ptr<CoreCtx>>& cores, const std::function<void()>& kernel,
                        int block, std::vector<std::string>& errors, std::vector<std::thread>& threads)
{
    group.alive = static_cast<int>(cores.size());
    errors.assign(cores.size(), std::string());
    sched.size[block] = static_cast<int>(cores.size());
    for (size_t i = 0; i < cores.size(); ++i) {
        threads.emplace_back([&, i, block]() {
            std::string aborted;
            {
                std::unique_lock<std::mutex> lock(sched.mu);
                sched.cv.wait(lock, [&] { return sched.running == block || sched.aborted; });
                if (sched.aborted) aborted = sched.abortMessage;
            }
            tls_core = cores[i].get();
            tls_launch_type = opt.type;
            try {
                if (!aborted.empty()) throw EmuError(aborted);
                kernel();
                CheckCoreClean(*cores[i]);
            } catch (const std::exception& e) {
                errors[i] = e.what();
                std::lock_guard<std::mutex> lock(group.mu);
                if (!group.aborted) {
                    group.aborted = true;
                    group.abortMessage = std::string("aborted because another core failed: ") + e.what();
                }
            }
            {
                std::lock_guard<std::mutex> lock(group.mu);
                group.alive--;
                group.cv.notify_all();
            }
            tls_core = nullptr;
            std::lock_guard<std::mutex> lock(sched.mu);
            sched.ended[block]++;
            sched.cv.notify_all();
        });
    }
}

// Gives AI Core `block` its turn and waits until each of its cores has ended or parked at a
// SyncAll.
inline void TakeTurn(Schedule& sched, int block)
{
    std::unique_lock<std::mutex> lock(sched.mu);
    sched.running = block;
    sched.cv.notify_all();
    sched.cv.wait(lock, [&] { return sched.parked[block] + sched.ended[block] == sched.size[block]; });
    sched.running = -1;
}

// A core's counters and timelines into the launch's totals (core_cycles: see AddAiCore).
inline void AddCore(Stats& total, const CoreCtx& c)
{
    total.Add(c.stats);
    for (int p = 0; p < kPipes; ++p) {
        const double busy = p == P_S ? c.tm.scalarBusy : c.tm.pipe[p].busy;
        total.pipe_busy[p] = std::max(total.pipe_busy[p], busy);
        total.pipe_busy_total[p] += busy;
        total.pipe_instructions[p] += c.tm.pipe[p].count;
    }
}

// One AI Core's time into the launch's: the latest completion on its cores, but no earlier than
// its GM reads (the AIC's and both AIVs' MTE2) at the AI Core's read rate, nor its GM writes
// (both AIVs' MTE3 and the AIC's Fixpipe) at its write rate: the engines share the AI Core's
// ports, a bound rather than a timeline (who waits for whom is not modelled).
inline void AddAiCore(Stats& total, const std::vector<std::unique_ptr<CoreCtx>>& cores, const TimingParams& tp)
{
    double end = 0, reads = 0, writes = 0;
    for (const auto& c : cores) {
        end = std::max(end, c->tm.End());
        reads += static_cast<double>(c->stats.gm_to_l1 + c->stats.gm_to_ub);
        writes += static_cast<double>(c->stats.ub_to_gm + c->stats.l0c_to_gm);
    }
    const double readBound = reads / tp.mte2_bytes_per_cycle;
    const double writeBound = writes / tp.core_write_bytes_per_cycle;
    total.timeline_cycles = std::max(total.timeline_cycles, end);
    total.core_read_bound_cycles = std::max(total.core_read_bound_cycles, readBound);
    total.core_write_bound_cycles = std::max(total.core_write_bound_cycles, writeBound);
    total.core_cycles = std::max(total.core_cycles, std::max(end, std::max(readBound, writeBound)));
}

// Run `kernel` (called with no arguments on every core) over options.blockDim AI Cores.
// Returns the summed statistics and the launch's modelled time; throws EmuError with the
// first failure.
inline Stats Launch(const LaunchOptions& opt, GmRegistry& gm, const std::function<void()>& kernel)
{
    if (opt.blockDim < 1) throw EmuError("launch: blockDim must be >= 1");
    const bool mix = opt.type == KERNEL_TYPE_MIX_AIC_1_2;
    if (!mix && opt.type != KERNEL_TYPE_AIC_ONLY && opt.type != KERNEL_TYPE_AIV_ONLY) {
        throw EmuError("launch: the emulation runs KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_AIV_ONLY and KERNEL_TYPE_MIX_AIC_1_2");
    }
    if (!(opt.timing.cube_macs_per_cycle > 0 && opt.timing.mte2_bytes_per_cycle > 0 &&
          opt.timing.core_write_bytes_per_cycle > 0 &&
          opt.timing.l2_aggregate_bytes_per_cycle > 0 && opt.timing.hbm_aggregate_bytes_per_cycle > 0)) {
        throw EmuError("launch: the timing model's parameters are not set (pasa_npu.npu_params supplies them)");
    }
    gm.ResetShadows();
    Stats total;
    const int n = opt.blockDim;
    Schedule sched;
    sched.size.assign(n, 0);
    sched.parked.assign(n, 0);
    sched.ended.assign(n, 0);
    std::vector<std::unique_ptr<Group>> groups(n);
    std::vector<std::vector<std::unique_ptr<CoreCtx>>> cores(n);
    std::vector<std::vector<std::string>> errors(n);
    std::vector<std::vector<std::thread>> threads(n);
    int finished = 0;  // AI Cores whose threads are joined and whose statistics are added
    // Joins every thread started and not yet joined (a thread left joinable when the launch
    // throws would terminate the process; no core may be parked when this runs).
    auto joinStarted = [&]() {
        for (auto& started : threads) {
            for (auto& t : started) {
                if (t.joinable()) t.join();
            }
        }
    };
    // Joins the AI Cores before `upto`, throws the first failure, adds their statistics and
    // frees their memories (only when no core is parked: none then waits for them). Before
    // it throws it joins every thread started: after a SyncAll the later AI Cores have run
    // to their end too.
    auto finish = [&](int upto) {
        for (; finished < upto; ++finished) {
            for (auto& t : threads[finished]) t.join();
            const std::string first = FirstError(errors[finished]);
            if (!first.empty()) {
                joinStarted();
                throw EmuError(first);
            }
            CheckFlagsDrained(*groups[finished], finished);
            for (auto& c : cores[finished]) AddCore(total, *c);
            AddAiCore(total, cores[finished], opt.timing);
            total.blocks += 1;
            total.cores += cores[finished].size();
            cores[finished].clear();
        }
    };
    for (int block = 0; block < n; ++block) {
        groups[block] = std::make_unique<Group>();
        Group& group = *groups[block];
        group.schedule = &sched;
        group.mix = mix;
        group.timeoutSeconds = opt.timeoutSeconds;
        group.timing = &opt.timing;
        cores[block] = MakeCores(opt, gm, group, block);
        StartAiCore(opt, sched, group, cores[block], kernel, block, errors[block], threads[block]);
        TakeTurn(sched, block);
        if (sched.arrived == 0) finish(block + 1);
    }
    while (sched.arrived > 0) {
        {
            std::lock_guard<std::mutex> lock(sched.mu);
            int all = 0;
            for (int size : sched.size) all += size;
            if (sched.arrived != all) {
                sched.aborted = true;
                sched.abortMessage = "aborted because SyncAll was reached by " + std::to_string(sched.arrived) + " of the launch's " +
                                     std::to_string(all) + " cores; the others ended without it (on hardware the launch hangs)";
                sched.cv.notify_all();
                break;
            }
            {
                std::lock_guard<std::mutex> gmLock(gm.mu);
                gm.ResetOrdering();
            }
            sched.releaseAt = sched.latest;
            sched.latest = 0;
            sched.arrived = 0;
            std::fill(sched.parked.begin(), sched.parked.end(), 0);
            sched.released++;
        }
        for (int block = 0; block < n; ++block) {
            if (sched.ended[block] < sched.size[block]) TakeTurn(sched, block);
        }
    }
    if (sched.aborted) {
        joinStarted();
        std::vector<std::string> all;
        for (int block = finished; block < n; ++block) all.insert(all.end(), errors[block].begin(), errors[block].end());
        throw EmuError(FirstError(all));
    }
    finish(n);
    const TimingParams& tp = opt.timing;
    const double gmBytes = static_cast<double>(total.gm_to_l1 + total.gm_to_ub + total.ub_to_gm + total.l0c_to_gm);
    total.hbm_bytes = gm.TouchedIoBytes();
    total.l2_bound_cycles = gmBytes / tp.l2_aggregate_bytes_per_cycle;
    total.hbm_bound_cycles = static_cast<double>(total.hbm_bytes) / tp.hbm_aggregate_bytes_per_cycle;
    total.cycles = tp.launch_overhead_cycles +
                   std::max(total.core_cycles, std::max(total.l2_bound_cycles, total.hbm_bound_cycles));
    return total;
}

}  // namespace emu
}  // namespace AscendC
