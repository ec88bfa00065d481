// Compare and select instructions: vcmpvs_<op> (vector against scalar), set_cmpmask /
// get_cmpmask, vsel.
//
// Contract.
// * vcmpvs_<op>(dst, src, scalar, repeat, dstBlk, srcBlk, dstRep, srcRep): bit i of repeat r,
//   at bit i of byte r * lanes / 8 of dst (the results of successive repeats are contiguous;
//   dst strides play no part), is src lane <op> scalar; an inactive lane's bit is 0. A NaN
//   compares unequal to everything: only `ne` is true.
// * set_cmpmask(p): the 16 bytes at p into the CMPMASK register; get_cmpmask(p) stores them.
// * vsel(dst, src0, src1, repeat, 6 strides): mode 0, lane i takes src0 where bit i of CMPMASK
//   is set, else src1 (every repeat reads the same 128 bits).
// * vsel(dst, src0, x, repeat, 6 strides, mode): mode 1, x holds the selection bits and the
//   second operand is the scalar in CMPMASK's first element; mode 2, x is the second operand
//   tensor and CMPMASK's first 8 bytes hold the selection bits' address. The selection bit of
//   lane i of repeat r is bit r * lanes + i of the bits.
// * Each reports PIPE_V, its operand blocks, the selection or result bits' bytes, and its
//   repeats (one a cycle, sim_pipes.h); set_cmpmask / get_cmpmask read / write 16 bytes of UB.
#ifndef PASA_SIM_CMPSEL_H
#define PASA_SIM_CMPSEL_H

#include "sim_core.h"
#include "sim_pipes.h"

namespace pasa_sim {

template <typename T, typename S, typename C>
inline void CompareScalar(uint8_t* dst, T* src, S scalar, uint64_t repeat, uint64_t srcBlk, uint64_t srcRep, C cmp)
{
    const double b = Value(static_cast<T>(scalar));
    const VecIter it(sizeof(T), repeat);
    ++State().instructions;
    Begin("vcmpvs", PIPE_V);
    VecOperand(src, sizeof(T), it.lanes, repeat, srcBlk, srcRep, false);
    Write(dst, (it.Repeats() * it.lanes + 7) / 8);
    VecCost(AscendC::emu::VecKind::Simple, sizeof(T), repeat);
    Issue();
    Trace("vcmpvs dst=%p repeat=%llu counter=%d mask=%llx:%llx", (void*)dst, (unsigned long long)repeat, (int)CounterMode(),
          (unsigned long long)State().maskHigh, (unsigned long long)State().maskLow);
    for (uint64_t r = 0, n = it.Repeats(); r < n; ++r) {
        for (uint32_t i = 0; i < it.lanes; ++i) {
            const uint64_t bit = r * it.lanes + i;
            const bool on = it.Active(r, i) && cmp(Value(*Lane(src, r, i, srcBlk, srcRep)), b);
            if (on) dst[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
            else dst[bit / 8] &= static_cast<uint8_t>(~(1u << (bit % 8)));
        }
    }
}

inline bool Bit(const uint8_t* bits, uint64_t k) { return (bits[k / 8] >> (k % 8)) & 1u; }

inline void CmpMaskMove(const char* name, void* p, bool write)
{
    Begin(name, PIPE_V);
    Touch(p, 16, write);
    Cost(Work::kVec, 1);
    Issue();
}

// The record of vsel: src0 and, for modes 0 and 2, the tensor src1; for modes 1 and 2 the
// selection bits at `bits`.
template <typename T>
inline void SelectRecord(T* dst, T* src0, T* src1, const void* bits, uint64_t repeat, uint64_t dB, uint64_t s0B,
                         uint64_t s1B, uint64_t dR, uint64_t s0R, uint64_t s1R)
{
    const VecIter it(sizeof(T), repeat);
    Begin("vsel", PIPE_V);
    VecOperand(src0, sizeof(T), it.lanes, repeat, s0B, s0R, false);
    if (src1 != nullptr) VecOperand(src1, sizeof(T), it.lanes, repeat, s1B, s1R, false);
    if (bits != nullptr) Read(bits, (it.Repeats() * it.lanes + 7) / 8);
    VecOperand(dst, sizeof(T), it.lanes, repeat, dB, dR, true);
    VecCost(AscendC::emu::VecKind::Simple, sizeof(T), repeat);
    Issue();
}

}  // namespace pasa_sim

#define PASA_SIM_VCMPVS(name, expr)                                                                                   \
    template <typename T, typename S>                                                                                 \
    inline void name(uint8_t* dst, T* src, S scalar, uint64_t repeat, uint64_t, uint64_t srcBlk, uint64_t,           \
                     uint64_t srcRep)                                                                                 \
    {                                                                                                                 \
        pasa_sim::CompareScalar(dst, src, scalar, repeat, srcBlk, srcRep,                                             \
                                [](double a, double b) { return expr; });                                             \
    }
PASA_SIM_VCMPVS(vcmpvs_lt, a < b)
PASA_SIM_VCMPVS(vcmpvs_gt, a > b)
PASA_SIM_VCMPVS(vcmpvs_le, a <= b)
PASA_SIM_VCMPVS(vcmpvs_ge, a >= b)
PASA_SIM_VCMPVS(vcmpvs_eq, a == b)
PASA_SIM_VCMPVS(vcmpvs_ne, a != b)
#undef PASA_SIM_VCMPVS

template <typename T>
inline void set_cmpmask(T* p)
{
    pasa_sim::CmpMaskMove("set_cmpmask", p, false);
    std::memcpy(pasa_sim::State().cmpMask, p, 16);
}
template <typename T>
inline void get_cmpmask(T* p)
{
    pasa_sim::CmpMaskMove("get_cmpmask", p, true);
    std::memcpy(p, pasa_sim::State().cmpMask, 16);
}

template <typename T>
inline void vsel(T* dst, T* src0, T* src1, uint64_t repeat, uint64_t dB, uint64_t s0B, uint64_t s1B, uint64_t dR,
                 uint64_t s0R, uint64_t s1R)
{
    using namespace pasa_sim;
    uint8_t bits[16];
    std::memcpy(bits, State().cmpMask, 16);
    SelectRecord(dst, src0, src1, nullptr, repeat, dB, s0B, s1B, dR, s0R, s1R);
    VecIter(sizeof(T), repeat).Run([&](uint64_t r, uint32_t i) {
        const T a = *Lane(src0, r, i, s0B, s0R), b = *Lane(src1, r, i, s1B, s1R);
        *Lane(dst, r, i, dB, dR) = Bit(bits, i) ? a : b;
    });
}

template <typename T, typename X>
inline void vsel(T* dst, T* src0, X* x, uint64_t repeat, uint64_t dB, uint64_t s0B, uint64_t s1B, uint64_t dR,
                 uint64_t s0R, uint64_t s1R, uint64_t mode)
{
    using namespace pasa_sim;
    const VecIter it(sizeof(T), repeat);
    if (mode == 1) {
        T scalar;
        std::memcpy(&scalar, State().cmpMask, sizeof(T));
        const uint8_t* bits = reinterpret_cast<const uint8_t*>(x);
        SelectRecord<T>(dst, src0, nullptr, bits, repeat, dB, s0B, s1B, dR, s0R, s1R);
        it.Run([&](uint64_t r, uint32_t i) {
            const T a = *Lane(src0, r, i, s0B, s0R);
            *Lane(dst, r, i, dB, dR) = Bit(bits, r * it.lanes + i) ? a : scalar;
        });
    } else if (mode == 2) {
        int64_t addr;
        std::memcpy(&addr, State().cmpMask, 8);
        const uint8_t* bits = reinterpret_cast<const uint8_t*>(addr);
        T* src1 = reinterpret_cast<T*>(x);
        SelectRecord(dst, src0, src1, bits, repeat, dB, s0B, s1B, dR, s0R, s1R);
        it.Run([&](uint64_t r, uint32_t i) {
            const T a = *Lane(src0, r, i, s0B, s0R), b = *Lane(src1, r, i, s1B, s1R);
            *Lane(dst, r, i, dB, dR) = Bit(bits, r * it.lanes + i) ? a : b;
        });
    } else {
        Fail("vsel mode %llu is not simulated", static_cast<unsigned long long>(mode));
    }
}

#endif
