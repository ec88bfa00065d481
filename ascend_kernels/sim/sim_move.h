// Data movement between GM and UB (MTE2 / MTE3), GM and L1 (bursts), and inside UB (on V).
// Each move reports its pipe, the bursts it reads and writes and its bytes (sim_pipes.h).
//
// Contract.
// * copy_gm_to_ubuf / copy_ubuf_to_gm / copy_ubuf_to_ubuf(dst, src, sid, nBurst, lenBurst,
//   srcGap, dstGap): nBurst bursts of lenBurst 32-byte blocks; burst k starts at
//   k * (lenBurst + gap) * 32 bytes on each side, the gap of that side.
// * copy_gm_to_ubuf_align_b{8,16,32}(dst, src, sid, nBurst, lenBurst, leftPad, rightPad,
//   srcGap, dstGap): burst k copies lenBurst bytes from GM at k * (lenBurst + srcGap) bytes to
//   UB after leftPad elements; leftPad and rightPad elements hold the pad register
//   (set_mov_pad_val, its low bytes; 0 until set); the UB row is the data and the padding
//   rounded up to 32 bytes, and rows lie dstGap 32-byte blocks apart. The rest of the row
//   ("dummy" elements) holds the burst's first element where leftPad = rightPad = 0, else the
//   pad register (DataCopyPad's documented padding, which passes its operands through).
// * copy_ubuf_to_gm_align_b{8,16,32}(dst, src, sid, nBurst, lenBurst, 0, 0, srcGap, dstGap):
//   burst k copies lenBurst bytes from UB row k (rows of lenBurst rounded up to 32 bytes,
//   srcGap 32-byte blocks apart) to GM at k * (lenBurst + dstGap) bytes.
#ifndef PASA_SIM_MOVE_H
#define PASA_SIM_MOVE_H

#include <cstring>

#include "sim_core.h"
#include "sim_pipes.h"

namespace pasa_sim {

inline void Bursts(const char* name, int pipe, void* dst, const void* src, uint64_t nBurst, uint64_t lenBurst,
                   uint64_t srcGap, uint64_t dstGap)
{
    ++State().instructions;
    Begin(name, pipe);
    TouchBursts(src, nBurst, lenBurst * 32, (lenBurst + srcGap) * 32, false);
    TouchBursts(dst, nBurst, lenBurst * 32, (lenBurst + dstGap) * 32, true);
    const double bytes = static_cast<double>(nBurst * lenBurst * 32);
    if (pipe == PIPE_V) Cost(Work::kVec, std::ceil(bytes / 256));
    else Cost(pipe == PIPE_MTE2 ? Work::kGmRead : Work::kGmWrite, bytes);
    Issue();
    Trace("bursts dst=%p src=%p n=%llu len=%llu srcGap=%llu dstGap=%llu", dst, src, (unsigned long long)nBurst,
          (unsigned long long)lenBurst, (unsigned long long)srcGap, (unsigned long long)dstGap);
    for (uint64_t k = 0; k < nBurst; ++k) {
        std::memmove(static_cast<uint8_t*>(dst) + k * (lenBurst + dstGap) * 32,
                     static_cast<const uint8_t*>(src) + k * (lenBurst + srcGap) * 32, lenBurst * 32);
    }
}

template <uint32_t Size>
inline void PaddedIn(void* dst, const void* src, uint64_t nBurst, uint64_t len, uint64_t left, uint64_t right,
                     uint64_t srcGap, uint64_t dstGap)
{
    ++State().instructions;
    const uint64_t row = (left * Size + len + right * Size + 31) / 32 * 32;
    Begin("copy_gm_to_ubuf_align", PIPE_MTE2);
    TouchBursts(src, nBurst, len, len + srcGap, false);
    TouchBursts(dst, nBurst, row, row + dstGap * 32, true);
    Cost(Work::kGmRead, static_cast<double>(nBurst * row));
    Issue();
    const uint64_t pad = State().movPadVal;
    for (uint64_t k = 0; k < nBurst; ++k) {
        uint8_t* d = static_cast<uint8_t*>(dst) + k * (row + dstGap * 32);
        for (uint64_t e = 0; e < left; ++e) std::memcpy(d + e * Size, &pad, Size);
        std::memmove(d + left * Size, static_cast<const uint8_t*>(src) + k * (len + srcGap), len);
        for (uint64_t e = 0; e < right; ++e) std::memcpy(d + left * Size + len + e * Size, &pad, Size);
        const uint8_t* dummy = (left == 0 && right == 0) ? d : reinterpret_cast<const uint8_t*>(&pad);
        for (uint64_t at = left * Size + len + right * Size; at + Size <= row; at += Size) std::memcpy(d + at, dummy, Size);
    }
}

inline void PaddedOut(void* dst, const void* src, uint64_t nBurst, uint64_t len, uint64_t srcGap, uint64_t dstGap)
{
    ++State().instructions;
    const uint64_t row = (len + 31) / 32 * 32;
    Begin("copy_ubuf_to_gm_align", PIPE_MTE3);
    TouchBursts(src, nBurst, len, row + srcGap * 32, false);
    TouchBursts(dst, nBurst, len, len + dstGap, true);
    Cost(Work::kGmWrite, static_cast<double>(nBurst * row));
    Issue();
    for (uint64_t k = 0; k < nBurst; ++k) {
        std::memmove(static_cast<uint8_t*>(dst) + k * (len + dstGap),
                     static_cast<const uint8_t*>(src) + k * (row + srcGap * 32), len);
    }
}

}  // namespace pasa_sim

#define PASA_SIM_BURSTS(name, pipe)                                                                                   \
    template <typename D, typename S>                                                                                 \
    inline void name(D* dst, S* src, uint64_t, uint64_t nBurst, uint64_t lenBurst, uint64_t srcGap, uint64_t dstGap)  \
    {                                                                                                                 \
        pasa_sim::Bursts(#name, pipe, dst, src, nBurst, lenBurst, srcGap, dstGap);                                    \
    }
PASA_SIM_BURSTS(copy_gm_to_ubuf, PIPE_MTE2)
PASA_SIM_BURSTS(copy_ubuf_to_gm, PIPE_MTE3)
PASA_SIM_BURSTS(copy_ubuf_to_ubuf, PIPE_V)
#undef PASA_SIM_BURSTS

#define PASA_SIM_PAD_IN(name, size)                                                                                   \
    template <typename D, typename S>                                                                                 \
    inline void name(D* dst, S* src, uint64_t, uint64_t nBurst, uint64_t len, uint64_t left, uint64_t right,          \
                     uint64_t srcGap, uint64_t dstGap)                                                                \
    {                                                                                                                 \
        pasa_sim::PaddedIn<size>(dst, src, nBurst, len, left, right, srcGap, dstGap);                                 \
    }
PASA_SIM_PAD_IN(copy_gm_to_ubuf_align_b8, 1)
PASA_SIM_PAD_IN(copy_gm_to_ubuf_align_b16, 2)
PASA_SIM_PAD_IN(copy_gm_to_ubuf_align_b32, 4)
#undef PASA_SIM_PAD_IN

#define PASA_SIM_PAD_OUT(name)                                                                                        \
    template <typename D, typename S>                                                                                 \
    inline void name(D* dst, S* src, uint64_t, uint64_t nBurst, uint64_t len, uint64_t, uint64_t, uint64_t srcGap,    \
                     uint64_t dstGap)                                                                                 \
    {                                                                                                                 \
        pasa_sim::PaddedOut(dst, src, nBurst, len, srcGap, dstGap);                                                   \
    }
PASA_SIM_PAD_OUT(copy_ubuf_to_gm_align_b8)
PASA_SIM_PAD_OUT(copy_ubuf_to_gm_align_b16)
PASA_SIM_PAD_OUT(copy_ubuf_to_gm_align_b32)
#undef PASA_SIM_PAD_OUT

template <typename V>
inline void set_mov_pad_val(V v)
{
    pasa_sim::ScalarOp("set_mov_pad_val");
    pasa_sim::State().movPadVal = static_cast<uint64_t>(v);
}

#endif
