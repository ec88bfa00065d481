// The emulation's cores: the traffic counters, the GM registry, one core's context (a
// thread) and one AI Core's group, and the issue of an instruction on a pipe with the
// hazard check of its accesses (emu_runtime.h, "Hazard model").
#pragma once

#include "emu_hardware.h"

namespace AscendC {
namespace emu {

// ------------------------------------------------------------------ statistics
// Bytes moved per path and work per unit, summed over all cores of a launch.
struct Stats {
    uint64_t gm_to_l1 = 0, l1_fill = 0, l1_to_l0a = 0, l1_to_l0b = 0, l0c_to_gm = 0;
    uint64_t gm_to_ub = 0, ub_to_gm = 0;
    uint64_t mmad_calls = 0, cube_macs = 0;
    uint64_t vector_instructions = 0, vector_elements = 0, scalar_ub_accesses = 0;
    uint64_t scalar_gm_accesses = 0, scalar_gm_misses = 0, scalar_gm_preloads = 0;  // through the scalar unit's data cache
    uint64_t cross_core_sets = 0, cross_core_waits = 0;
    uint64_t blocks = 0, cores = 0;
    // timing model (per launch; not summed by Add)
    double cycles = 0;             // modelled cycles of the launch
    double core_cycles = 0;        // the slowest AI Core: its latest completion, or its port bounds if later
    double timeline_cycles = 0;          // the latest completion on any core's timelines
    double core_read_bound_cycles = 0;   // the largest AI Core's GM read bytes over mte2_bytes_per_cycle
    double core_write_bound_cycles = 0;  // the largest AI Core's GM write bytes over core_write_bytes_per_cycle
    double l2_bound_cycles = 0;    // all GM bytes over the aggregate L2 bandwidth
    double hbm_bound_cycles = 0;   // bytes first touched in GM over the aggregate HBM bandwidth
    uint64_t hbm_bytes = 0;
    std::array<double, 7> pipe_busy{};        // busiest instance of each pipe, cycles
    std::array<double, 7> pipe_busy_total{};  // summed over all cores
    std::array<uint64_t, 7> pipe_instructions{};
    void Add(const Stats& o)
    {
        gm_to_l1 += o.gm_to_l1; l1_fill += o.l1_fill; l1_to_l0a += o.l1_to_l0a; l1_to_l0b += o.l1_to_l0b;
        l0c_to_gm += o.l0c_to_gm; gm_to_ub += o.gm_to_ub; ub_to_gm += o.ub_to_gm;
        mmad_calls += o.mmad_calls; cube_macs += o.cube_macs;
        vector_instructions += o.vector_instructions; vector_elements += o.vector_elements;
        scalar_ub_accesses += o.scalar_ub_accesses; cross_core_sets += o.cross_core_sets;
        scalar_gm_accesses += o.scalar_gm_accesses; scalar_gm_misses += o.scalar_gm_misses;
        scalar_gm_preloads += o.scalar_gm_preloads;
        cross_core_waits += o.cross_core_waits; blocks += o.blocks; cores += o.cores;
    }
};

using Clock = std::array<uint32_t, kSlots>;
inline void Join(Clock& into, const Clock& c)
{
    for (int i = 0; i < kSlots; ++i) into[i] = std::max(into[i], c[i]);
}

// Last accesses of one 32-byte block, for the hazard check.
struct AccessRecord {
    uint32_t writeSeq = 0;
    int8_t writeSlot = -1;
    const char* writeOp = nullptr;
    std::array<uint32_t, kSlots> readSeq{};
    const char* readOp = nullptr;
};

// ------------------------------------------------------------------ GM registry
struct GmBuffer {
    std::string name;
    uint8_t* base = nullptr;
    size_t bytes = 0;
    bool writable = false;
    bool tracked = false;  // hazard-checked (cube <-> vector exchange areas)
    std::vector<AccessRecord> shadow;
    std::vector<int32_t> writerBlock;  // AI Core that wrote each 32-byte block in this launch
    std::vector<int32_t> readerBlock;  // AI Core(s) that read it
    std::vector<uint8_t> touched;      // 512-byte granules accessed in this launch (the HBM bound)
};

class GmRegistry {
public:
    void Add(const std::string& name, void* base, size_t bytes, bool writable, bool tracked)
    {
        GmBuffer b;
        b.name = name;
        b.base = static_cast<uint8_t*>(base);
        b.bytes = bytes;
        b.writable = writable;
        b.tracked = tracked;
        b.touched.assign((bytes + kGranuleBytes - 1) / kGranuleBytes, 0);
        if (tracked) {
            b.shadow.resize((bytes + kBlockBytes - 1) / kBlockBytes);
            b.writerBlock.assign(b.shadow.size(), -1);
            b.readerBlock.assign(b.shadow.size(), -1);
        }
        buffers_.push_back(std::move(b));
    }
    GmBuffer* Find(const void* p, size_t bytes)
    {
        const uint8_t* a = static_cast<const uint8_t*>(p);
        for (auto& b : buffers_) {
            if (a >= b.base && a + bytes <= b.base + b.bytes) return &b;
        }
        return nullptr;
    }
    void ResetShadows()
    {
        for (auto& b : buffers_) {
            std::fill(b.touched.begin(), b.touched.end(), 0);
            if (b.tracked) {
                std::fill(b.shadow.begin(), b.shadow.end(), AccessRecord{});
                std::fill(b.writerBlock.begin(), b.writerBlock.end(), -1);
                std::fill(b.readerBlock.begin(), b.readerBlock.end(), -1);
            }
        }
    }
    // After an all-core barrier every earlier access is ordered before every later one: the
    // hazard records start afresh (the touched granules, the HBM bound, do not).
    void ResetOrdering()
    {
        for (auto& b : buffers_) {
            if (!b.tracked) continue;
            std::fill(b.shadow.begin(), b.shadow.end(), AccessRecord{});
            std::fill(b.writerBlock.begin(), b.writerBlock.end(), -1);
            std::fill(b.readerBlock.begin(), b.readerBlock.end(), -1);
        }
    }
    // Bytes of the kernel's inputs and outputs (not the workspace) touched in this launch.
    uint64_t TouchedIoBytes() const
    {
        uint64_t n = 0;
        for (const auto& b : buffers_) {
            if (b.tracked) continue;
            for (uint8_t t : b.touched) n += t;
        }
        return n * kGranuleBytes;
    }
    std::mutex mu;

private:
    std::vector<GmBuffer> buffers_;
};

struct Group;

// ------------------------------------------------------------------ scalar data cache
// The lines of GM one core's scalar unit holds: kDataCacheBytes in kDataCacheLineBytes lines,
// the least recently used one out first, each with the time its fill lands. It starts empty at
// each launch.
class ScalarDataCache {
public:
    // Whether every line of [p, p + bytes) was held; they are all held afterwards. `ready`: when
    // the last of the held lines lands (a preload's lines land later than it is issued).
    bool Access(const void* p, size_t bytes, double& ready)
    {
        bool hit = true;
        ready = 0;
        for (uint64_t line = Line(p); line <= LastLine(p, bytes); ++line) {
            auto it = lines_.find(line);
            if (it == lines_.end()) {
                hit = false;
                Insert(line, 0);
            } else {
                it->second.lastUse = ++clock_;
                ready = std::max(ready, it->second.ready);
            }
        }
        return hit;
    }
    // The lines of [p, p + bytes) not held yet arrive at `ready` (a preload).
    void Preload(const void* p, size_t bytes, double ready)
    {
        for (uint64_t line = Line(p); line <= LastLine(p, bytes); ++line) {
            if (lines_.find(line) == lines_.end()) Insert(line, ready);
        }
    }
    void Drop(const void* p) { lines_.erase(Line(p)); }
    void Clear() { lines_.clear(); }

private:
    struct Held {
        uint64_t lastUse;
        double ready;  // when its fill lands
    };
    static uint64_t Line(const void* p) { return reinterpret_cast<uintptr_t>(p) / kDataCacheLineBytes; }
    // the line of the last byte of [p, p + bytes) (p's own where bytes is 0)
    static uint64_t LastLine(const void* p, size_t bytes) { return Line(static_cast<const uint8_t*>(p) + (bytes ? bytes - 1 : 0)); }
    void Insert(uint64_t line, double ready)
    {
        if (lines_.size() == kDataCacheBytes / kDataCacheLineBytes) Evict();
        lines_[line] = Held{++clock_, ready};
    }
    void Evict()
    {
        auto oldest = lines_.begin();
        for (auto it = lines_.begin(); it != lines_.end(); ++it) {
            if (it->second.lastUse < oldest->second.lastUse) oldest = it;
        }
        lines_.erase(oldest);
    }
    std::unordered_map<uint64_t, Held> lines_;
    uint64_t clock_ = 0;
};

// ------------------------------------------------------------------ one core
// The unit flag of one L0C fractal (16 x 16 fp32, 1 KiB) under Mmad/Fixpipe unitFlag: set by the
// Mmad (unitFlag 3) that completes it, cleared by the Fixpipe (unitFlag 3) that reads it.
struct UnitFlagCell {
    bool set = false;
    Clock setBy{}, clearedBy{};            // what the Mmad that set it and the Fixpipe that cleared it had seen
    double setAt = 0, clearedAt = 0;       // when they did: the Mmad's end, the Fixpipe's L0C read
};
constexpr uint32_t kL0cFractalBytes = 1024;

struct CoreCtx {
    int type = AIV;        // AIC or AIV
    int blockIdx = 0;      // AI Core index within the launch
    int subIdx = 0;        // 0 for AIC, 0/1 for AIV
    int slot = 0;          // 0 AIC, 1 AIV0, 2 AIV1 within the group
    int blockDim = 1;
    Group* group = nullptr;
    GmRegistry* gm = nullptr;
    std::string name;

    std::vector<uint8_t> mem[static_cast<int>(Hardware::MAX)];
    std::vector<AccessRecord> shadow[static_cast<int>(Hardware::MAX)];

    std::array<uint32_t, kPipes> issued{};  // instructions issued per pipe
    std::array<Clock, kPipes> seen{};        // vector clock of each pipe
    std::vector<UnitFlagCell> unitFlags = std::vector<UnitFlagCell>(kL0CBytes / kL0cFractalBytes);

    // intra-core flags: armed snapshot per (event, id)
    bool flagSet[static_cast<int>(HardEvent::MAX)][kEventIds] = {};
    Clock flagClock[static_cast<int>(HardEvent::MAX)][kEventIds];
    bool eventIdUsed[static_cast<int>(HardEvent::MAX)][kEventIds] = {};
    bool queueFlag[static_cast<int>(HardEvent::MAX)][kEventIds] = {};  // held by a queue, its flag set

    bool pipeAlive = false;  // a TPipe exists
    // lanes a level-0 call left enabled in the vector mask register (0: the full mask, as
    // ResetMask sets it); instructions that read the register instead of setting it see them
    uint64_t partialMask = 0;
    ScalarDataCache dcache;  // the scalar unit's GM accesses
    Stats stats;
    CoreTiming tm;           // the timing model's timelines of this core

    bool Has(Hardware h) const
    {
        if (type == AIC) return h == Hardware::L1 || h == Hardware::L0A || h == Hardware::L0B || h == Hardware::L0C;
        return h == Hardware::UB;
    }
    int SlotOf(int pipe) const { return slot * kPipes + pipe; }
};

inline thread_local CoreCtx* tls_core = nullptr;

inline CoreCtx& Core()
{
    if (tls_core == nullptr) throw EmuError("AscendC API called outside an emulated kernel launch");
    return *tls_core;
}

// Raise an error naming the core that hit it.
[[noreturn]] inline void Fail(const char* fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::string msg = Format(fmt, ap);
    va_end(ap);
    if (tls_core != nullptr) msg = tls_core->name + ": " + msg;
    throw EmuError(msg);
}

// ------------------------------------------------------------------ one AI Core (group)
struct CrossFlag {
    int count[kCoresPerGroup] = {};                 // counter per waiting core
    std::deque<Clock> clocks[kCoresPerGroup];       // ordering carried by each increment
    std::deque<double> times[kCoresPerGroup];       // modelled time each increment becomes visible
    std::deque<Clock> aivSets[2];                   // mode 2, AIV -> AIC: sets not yet paired
    std::deque<double> aivTimes[2];
};

// The turns of a launch's AI Cores: one AI Core's cores run at a time, in block order, each
// until it has ended or parked at a SyncAll; once every core of the launch has parked there,
// the SyncAll releases them and the AI Cores take their turns again.
struct Schedule {
    std::mutex mu;
    std::condition_variable cv;
    int running = -1;                  // the AI Core whose cores may run
    std::vector<int> size, parked, ended;  // per AI Core: its cores, those at the pending SyncAll, those ended
    int arrived = 0;                   // cores at the pending SyncAll
    uint64_t released = 0;             // SyncAlls released so far
    double latest = 0;                 // the latest arrival at the pending SyncAll, cycles
    double releaseAt = 0;              // when the last SyncAll let its cores go on, cycles
    bool aborted = false;
    std::string abortMessage;
};

struct Group {
    Schedule* schedule = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    int alive = 0;
    int blocked = 0;
    bool aborted = false;
    std::string abortMessage;
    std::string waitingOn[kCoresPerGroup];
    int waitingFlag[kCoresPerGroup] = {-1, -1, -1};
    CrossFlag flags[kCrossFlags];

    // Every live core is blocked on a flag whose counter is zero: nobody can ever set it.
    bool Deadlocked() const
    {
        if (blocked != alive) return false;
        for (int s = 0; s < kCoresPerGroup; ++s) {
            if (waitingFlag[s] >= 0 && flags[waitingFlag[s]].count[s] > 0) return false;  // about to wake
        }
        return true;
    }
    double timeoutSeconds = 20.0;
    bool mix = false;
    const TimingParams* timing = nullptr;
};

// ------------------------------------------------------------------ instruction issue and hazards
inline uint32_t Issue(int pipe)
{
    CoreCtx& c = Core();
    const uint32_t seq = ++c.issued[pipe];
    c.seen[pipe][c.SlotOf(pipe)] = seq;
    return seq;
}

inline Clock PipeSnapshot(int pipe)
{
    CoreCtx& c = Core();
    Clock s = c.seen[pipe];
    s[c.SlotOf(pipe)] = c.issued[pipe];
    return s;
}

}  // namespace emu
}  // namespace AscendC
