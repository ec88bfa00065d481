// Element-wise vector instructions: binary (vadd ... vmin, vand, vor), unary (vexp, vln, vabs,
// vsqrt, vrec, vnot), vector-scalar (vadds, vmuls, vmaxs, vmins), vector_dup.
//
// Contract: each active lane (sim_core.h) is computed from its operands' values, exactly, and
// rounded once to the element type, to nearest even (IEEE arithmetic; half and bfloat16 as
// binary16/bfloat16). vexp and vln: the exact function rounded once to the element type (the
// hardware's approximation is not documented to the bit). vmax/vmin: a NaN operand gives NaN.
// Inactive lanes are left unchanged. Operands are read before the result is written, lane by
// lane in order, so in-place operation is safe. Each instruction reports PIPE_V, the blocks of
// its operands that hold an active lane, and its repeats (sim_pipes.h); vdiv, vexp, vln, vsqrt
// and vrec are costed at the published transcendental rate, the rest at one repeat a cycle.
#ifndef PASA_SIM_VEC_H
#define PASA_SIM_VEC_H

#include <cmath>

#include "sim_core.h"
#include "sim_pipes.h"

namespace pasa_sim {

// Under PASA_SIM_TRACE: the instruction, its operands and the sum of |result| over its lanes.
struct VecTrace {
    const char* name;
    double sum = 0;
    uint64_t lanes = 0;
    template <typename T>
    void Add(const T& v)
    {
        if (!Tracing()) return;
        const double x = Value(v);
        sum += std::isnan(x) ? 0.0 : std::fabs(x);
        ++lanes;
    }
    void Done(const void* dst, uint64_t repeat, uint64_t dB, uint64_t dR) const
    {
        Trace("%s dst=%p repeat=%llu dstBlk=%llu dstRep=%llu counter=%d mask=%llx:%llx lanes=%llu sum|x|=%g", name, dst,
              (unsigned long long)repeat, (unsigned long long)dB, (unsigned long long)dR, (int)CounterMode(),
              (unsigned long long)State().maskHigh, (unsigned long long)State().maskLow, (unsigned long long)lanes, sum);
    }
};

inline AscendC::emu::VecKind KindOf(const char* name)
{
    for (const char* t : {"vdiv", "vexp", "vln", "vsqrt", "vrec"}) {
        if (std::strcmp(name, t) == 0) return AscendC::emu::VecKind::Transcendental;
    }
    return AscendC::emu::VecKind::Simple;
}

template <typename T, typename F>
inline void Binary(T* dst, T* s0, T* s1, uint64_t repeat, uint64_t dB, uint64_t s0B, uint64_t s1B, uint64_t dR,
                   uint64_t s0R, uint64_t s1R, F op, const char* name = "binary")
{
    VecTrace t{name};
    constexpr uint32_t lanes = 256 / sizeof(T);
    Begin(name, PIPE_V);
    VecOperand(s0, sizeof(T), lanes, repeat, s0B, s0R, false);
    VecOperand(s1, sizeof(T), lanes, repeat, s1B, s1R, false);
    VecOperand(dst, sizeof(T), lanes, repeat, dB, dR, true);
    VecCost(KindOf(name), sizeof(T), repeat);
    Issue();
    VecIter(sizeof(T), repeat).Run([&](uint64_t r, uint32_t i) {
        const T a = *Lane(s0, r, i, s0B, s0R), b = *Lane(s1, r, i, s1B, s1R);
        const T v = op(a, b);
        *Lane(dst, r, i, dB, dR) = v;
        t.Add(v);
    });
    t.Done(dst, repeat, dB, dR);
}

template <typename T, typename F>
inline void Unary(T* dst, T* src, uint64_t repeat, uint64_t dB, uint64_t sB, uint64_t dR, uint64_t sR, F op,
                  const char* name = "unary")
{
    VecTrace t{name};
    constexpr uint32_t lanes = 256 / sizeof(T);
    Begin(name, PIPE_V);
    VecOperand(src, sizeof(T), lanes, repeat, sB, sR, false);
    VecOperand(dst, sizeof(T), lanes, repeat, dB, dR, true);
    VecCost(KindOf(name), sizeof(T), repeat);
    Issue();
    VecIter(sizeof(T), repeat).Run([&](uint64_t r, uint32_t i) {
        const T v = op(*Lane(src, r, i, sB, sR));
        *Lane(dst, r, i, dB, dR) = v;
        t.Add(v);
    });
    t.Done(dst, repeat, dB, dR);
}

template <typename T>
inline T MaxOf(const T& a, const T& b)
{
    const double x = Value(a), y = Value(b);
    if (std::isnan(x)) return a;
    if (std::isnan(y)) return b;
    return x >= y ? a : b;
}

template <typename T>
inline T MinOf(const T& a, const T& b)
{
    const double x = Value(a), y = Value(b);
    if (std::isnan(x)) return a;
    if (std::isnan(y)) return b;
    return x <= y ? a : b;
}

template <typename T>
inline T Bitwise(const T& a, const T& b, int op)
{
    T r;
    const uint8_t* pa = reinterpret_cast<const uint8_t*>(&a);
    const uint8_t* pb = reinterpret_cast<const uint8_t*>(&b);
    uint8_t* pr = reinterpret_cast<uint8_t*>(&r);
    for (size_t k = 0; k < sizeof(T); ++k) pr[k] = op == 0 ? (pa[k] & pb[k]) : (pa[k] | pb[k]);
    return r;
}

}  // namespace pasa_sim

#define PASA_SIM_BINARY(name, expr)                                                                                     \
    template <typename T>                                                                                             \
    inline void name(T* dst, T* src0, T* src1, uint64_t repeat, uint64_t dstBlk, uint64_t src0Blk, uint64_t src1Blk,  \
                     uint64_t dstRep, uint64_t src0Rep, uint64_t src1Rep)                                             \
    {                                                                                                                 \
        using namespace pasa_sim;                                                                                     \
        Binary(dst, src0, src1, repeat, dstBlk, src0Blk, src1Blk, dstRep, src0Rep, src1Rep,                           \
               [](const T& a, const T& b) -> T { return expr; }, #name);                                              \
    }

PASA_SIM_BINARY(vadd, Store<T>(Value(a) + Value(b)))
PASA_SIM_BINARY(vsub, Store<T>(Value(a) - Value(b)))
PASA_SIM_BINARY(vmul, Store<T>(Value(a) * Value(b)))
PASA_SIM_BINARY(vdiv, Store<T>(Value(a) / Value(b)))
PASA_SIM_BINARY(vmax, MaxOf(a, b))
PASA_SIM_BINARY(vmin, MinOf(a, b))
PASA_SIM_BINARY(vand, Bitwise(a, b, 0))
PASA_SIM_BINARY(vor, Bitwise(a, b, 1))
#undef PASA_SIM_BINARY

#define PASA_SIM_UNARY(name, expr)                                                                                    \
    template <typename T>                                                                                             \
    inline void name(T* dst, T* src, uint64_t repeat, uint64_t dstBlk, uint64_t srcBlk, uint64_t dstRep,              \
                     uint64_t srcRep)                                                                                 \
    {                                                                                                                 \
        using namespace pasa_sim;                                                                                     \
        Unary(dst, src, repeat, dstBlk, srcBlk, dstRep, srcRep, [](const T& a) -> T { return expr; }, #name);        \
    }

PASA_SIM_UNARY(vexp, Store<T>(static_cast<double>(static_cast<T>(std::exp(static_cast<long double>(Value(a)))))))
PASA_SIM_UNARY(vln, Store<T>(static_cast<double>(static_cast<T>(std::log(static_cast<long double>(Value(a)))))))
PASA_SIM_UNARY(vabs, Store<T>(std::fabs(Value(a))))
PASA_SIM_UNARY(vsqrt, Store<T>(std::sqrt(Value(a))))
PASA_SIM_UNARY(vrec, Store<T>(1.0 / Value(a)))
PASA_SIM_UNARY(vrelu, Store<T>(Value(a) > 0 ? Value(a) : 0.0))
#undef PASA_SIM_UNARY

template <typename T>
inline void vnot(T* dst, T* src, uint64_t repeat, uint64_t dstBlk, uint64_t srcBlk, uint64_t dstRep, uint64_t srcRep)
{
    pasa_sim::Unary(dst, src, repeat, dstBlk, srcBlk, dstRep, srcRep, [](const T& a) -> T {
        T r = a;
        uint8_t* p = reinterpret_cast<uint8_t*>(&r);
        for (size_t k = 0; k < sizeof(T); ++k) p[k] = static_cast<uint8_t>(~p[k]);
        return r;
    }, "vnot");
}

#define PASA_SIM_SCALAR(name, expr)                                                                                   \
    template <typename T, typename S>                                                                                 \
    inline void name(T* dst, T* src, S scalar, uint64_t repeat, uint64_t dstBlk, uint64_t srcBlk, uint64_t dstRep,    \
                     uint64_t srcRep, bool strideMode0 = false, bool strideMode1 = false)                             \
    {                                                                                                                 \
        using namespace pasa_sim;                                                                                     \
        if (strideMode0 || strideMode1) Fail(#name ": the stride-mode operands are not simulated");                  \
        const T b = static_cast<T>(scalar);                                                                           \
        Unary(dst, src, repeat, dstBlk, srcBlk, dstRep, srcRep, [&](const T& a) -> T { return expr; }, #name);       \
    }

PASA_SIM_SCALAR(vadds, Store<T>(Value(a) + Value(b)))
PASA_SIM_SCALAR(vmuls, Store<T>(Value(a) * Value(b)))
PASA_SIM_SCALAR(vmaxs, MaxOf(a, b))
PASA_SIM_SCALAR(vmins, MinOf(a, b))
#undef PASA_SIM_SCALAR

// vector_dup(dst, scalar, repeat, dstBlk, srcBlk, dstRep, srcRep): the scalar into each active lane.
template <typename T, typename S>
inline void vector_dup(T* dst, S scalar, uint64_t repeat, uint64_t dstBlk, uint64_t, uint64_t dstRep, uint64_t)
{
    const T v = static_cast<T>(scalar);
    pasa_sim::Begin("vector_dup", PIPE_V);
    pasa_sim::VecOperand(dst, sizeof(T), 256 / sizeof(T), repeat, dstBlk, dstRep, true);
    pasa_sim::VecCost(AscendC::emu::VecKind::Simple, sizeof(T), repeat);
    pasa_sim::Issue();
    pasa_sim::VecIter(sizeof(T), repeat).Run([&](uint64_t r, uint32_t i) { *pasa_sim::Lane(dst, r, i, dstBlk, dstRep) = v; });
}

#endif
