// State of one simulated AI Core and the iteration every vector instruction shares.
//
// Vector iteration (Atlas A2): an instruction runs `repeat` iterations of 256 bytes; lane i of
// an operand of element size s lies in its 32-byte block i / (32 / s), the block b of repeat r
// at  base + (r * repStride + b * blkStride) * 32  bytes. Where source and destination differ
// in size (vconv), a repeat has 256 / max(size) lanes and each operand spans its own blocks.
// Normal mask mode: lane i is active where bit i of the 128-bit mask (high:low) is set (lanes
// of 32-bit elements use the low 64 bits). Counter mode (set_mask_count): the low mask word is
// an element count; the repeat operand is ignored, ceil(count / lanes) repeats run and the
// last one's lanes past the count are inactive.
#ifndef PASA_SIM_CORE_H
#define PASA_SIM_CORE_H

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "sim_float.h"

namespace pasa_sim {

[[noreturn]] inline void Fail(const char* fmt, ...)
{
    std::va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "pasa-sim: ");
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::abort();
}

[[noreturn]] inline void NotSimulated(const char* name)
{
    Fail("instruction %s is not simulated", name);
}

// With PASA_SIM_TRACE set, each traced instruction is printed to stderr with its operands.
inline bool Tracing()
{
    static const bool on = std::getenv("PASA_SIM_TRACE") != nullptr;
    return on;
}

inline void Trace(const char* fmt, ...)
{
    if (!Tracing()) return;
    std::va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "[sim %d] ", static_cast<int>(getpid()));
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
}

constexpr uint64_t kCtrlInfNanBit = 48;   // CTRL[48]: 1 inf/nan mode, 0 saturation mode
constexpr uint64_t kCtrlCounterBit = 56;  // CTRL[56]: 1 counter mask mode

struct CoreState {
    uint64_t ctrl = uint64_t(1) << kCtrlInfNanBit;
    uint64_t maskHigh = ~uint64_t(0);
    uint64_t maskLow = ~uint64_t(0);
    uint64_t accVal = 0;       // vcadd's accumulator (get_acc_val)
    uint64_t maxMinCnt = 0;    // vcmax/vcmin result register (get_max_min_cnt)
    uint8_t cmpMask[16] = {};  // CMPMASK register (set_cmpmask / vcmp results)
    uint64_t movPadVal = 0;    // set_mov_pad_val
    uint64_t padding = 0;      // set_padding
    uint64_t ndPara = 0;       // set_nd_para
    uint64_t quantPre = 0;     // set_quant_pre
    uint64_t l1_3dSize = 0;    // set_l1_3d_size
    int atomic = 0;            // set_atomic_*: 0 none
    uint32_t flags[16][16][8] = {};  // set_flag counts per (src pipe, dst pipe, event)
    uint64_t instructions = 0;
};

inline CoreState& State()
{
    static thread_local CoreState s;
    return s;
}

inline void ResetPipes();  // sim_issue.h: the hazard checker's and the timing model's state

inline void ResetState()
{
    State() = CoreState();
    ResetPipes();
}

inline bool CounterMode() { return (State().ctrl >> kCtrlCounterBit) & 1u; }
inline bool Saturating() { return !((State().ctrl >> kCtrlInfNanBit) & 1u); }

// The lanes of each repeat of a vector instruction: Run(f) calls f(r, i) for every active lane
// i of repeat r.
struct VecIter {
    uint32_t lanes;
    uint64_t repeat;

    VecIter(uint32_t maxElemBytes, uint64_t repeatArg) : lanes(256 / maxElemBytes), repeat(repeatArg) {}

    template <typename F>
    void Run(F&& f) const
    {
        CoreState& st = State();
        ++st.instructions;
        if (CounterMode()) {
            const uint64_t count = st.maskLow;
            for (uint64_t done = 0, r = 0; done < count; ++r, done += lanes) {
                const uint64_t n = count - done < lanes ? count - done : lanes;
                for (uint32_t i = 0; i < n; ++i) f(r, i);
            }
            return;
        }
        for (uint64_t r = 0; r < repeat; ++r) {
            for (uint32_t i = 0; i < lanes; ++i) {
                const uint64_t word = i < 64 ? st.maskLow : st.maskHigh;
                if (lanes <= 64 && i >= 64) continue;
                if ((word >> (i % 64)) & 1u) f(r, i);
            }
        }
    }

    // Repeats this instruction runs (counter mode: from the count).
    uint64_t Repeats() const
    {
        if (CounterMode()) return (State().maskLow + lanes - 1) / lanes;
        return repeat;
    }

    bool Active(uint64_t r, uint32_t i) const
    {
        const CoreState& st = State();
        if (CounterMode()) return r * lanes + i < st.maskLow;
        if (i >= 64 && lanes <= 64) return false;
        return ((i < 64 ? st.maskLow : st.maskHigh) >> (i % 64)) & 1u;
    }
};

// Element i of repeat r of an operand at `base` with element type T.
template <typename T>
inline T* Lane(T* base, uint64_t r, uint32_t i, uint64_t blkStride, uint64_t repStride)
{
    constexpr uint32_t perBlock = 32 / sizeof(T);
    uint8_t* p = reinterpret_cast<uint8_t*>(base) + (r * repStride + (i / perBlock) * blkStride) * 32 +
                 (i % perBlock) * sizeof(T);
    return reinterpret_cast<T*>(p);
}

// Arithmetic values of the element types: half and bfloat16_t through float.
template <typename T>
inline double Value(const T& v) { return static_cast<double>(static_cast<float>(v)); }

// x (exact in double) rounded once to T, to nearest even, under the core's overflow mode.
template <typename T>
inline T Store(double x)
{
    if constexpr (std::is_floating_point<T>::value) {
        return static_cast<T>(x);
    } else if constexpr (sizeof(T) == 2 && std::is_class<T>::value && std::is_same<T, half>::value) {
        T h;
        h.bits = std::isnan(x) ? F32ToF16(static_cast<float>(x), Round::kRint, Saturating())
                               : (std::isinf(x) ? F32ToF16(static_cast<float>(x), Round::kRint, Saturating())
                                                : ExactF16Bits(Quantize(x, kF16, Round::kRint, Saturating())));
        return h;
    } else if constexpr (std::is_same<T, bfloat16_t>::value) {
        T b;
        b.bits = F32ToBf16(static_cast<float>(x), Round::kRint, Saturating());
        return b;
    } else {
        return static_cast<T>(x);
    }
}

}  // namespace pasa_sim

#endif
