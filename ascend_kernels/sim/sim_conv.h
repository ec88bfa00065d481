// Type conversion instructions vconv_<from>2<to>[mode](dst, src, repeat, dstBlk, srcBlk,
// dstRep, srcRep). A repeat converts 256 / max(size of from, size of to) lanes (sim_core.h).
//
// Mode suffix: r to nearest even, a to nearest away from zero, f floor, c ceil, z toward zero,
// o to odd (sim_float.h); no suffix: to nearest even for a narrowing float conversion, exact
// for a widening one. Float to integer saturates to the integer's range, NaN to 0. A float
// result overflows to inf in inf/nan mode (CTRL[48] = 1, the simulator's start) and saturates
// to the largest finite value in saturation mode. Each conversion reports PIPE_V, the blocks of
// both operands that hold an active lane, and its repeats (sim_pipes.h).
#ifndef PASA_SIM_CONV_H
#define PASA_SIM_CONV_H

#include <limits>

#include "sim_core.h"
#include "sim_pipes.h"

namespace pasa_sim {

template <typename To, typename From, typename F>
inline void Convert(const char* name, To* dst, From* src, uint64_t repeat, uint64_t dB, uint64_t sB, uint64_t dR,
                    uint64_t sR, F op)
{
    constexpr uint32_t widest = sizeof(To) > sizeof(From) ? sizeof(To) : sizeof(From);
    Begin(name, PIPE_V);
    VecOperand(src, sizeof(From), 256 / widest, repeat, sB, sR, false);
    VecOperand(dst, sizeof(To), 256 / widest, repeat, dB, dR, true);
    VecCost(AscendC::emu::VecKind::Simple, widest, repeat);
    Issue();
    VecIter(widest, repeat).Run([&](uint64_t r, uint32_t i) { *Lane(dst, r, i, dB, dR) = op(*Lane(src, r, i, sB, sR)); });
}

template <typename To>
inline To FloatTo(double v, Round mode)
{
    if constexpr (std::is_same<To, half>::value) {
        To h;
        h.bits = std::isfinite(v) ? ExactF16Bits(Quantize(v, kF16, mode, Saturating()))
                                  : F32ToF16(static_cast<float>(v), mode, Saturating());
        return h;
    } else if constexpr (std::is_same<To, bfloat16_t>::value) {
        To b;
        b.bits = F32ToBf16(static_cast<float>(v), mode, Saturating());
        return b;
    } else if constexpr (std::is_same<To, float>::value) {
        return static_cast<float>(std::isfinite(v) ? Quantize(v, kF32, mode, Saturating()) : v);
    } else {
        return static_cast<To>(ToInteger(v, mode, std::numeric_limits<To>::min(), std::numeric_limits<To>::max()));
    }
}

}  // namespace pasa_sim

// vconv_<name>: each element of From converted to To by the expression `convert` of `v`.
#define PASA_SIM_VCONV_BY(name, From, To, convert)                                                                    \
    template <typename D, typename S>                                                                                 \
    inline void name(D* dst, S* src, uint64_t repeat, uint64_t dstBlk, uint64_t srcBlk, uint64_t dstRep,              \
                     uint64_t srcRep)                                                                                 \
    {                                                                                                                 \
        using namespace pasa_sim;                                                                                     \
        Convert(#name, reinterpret_cast<To*>(dst), reinterpret_cast<From*>(src), repeat, dstBlk, srcBlk, dstRep,      \
                srcRep, [](const From& v) -> To { return convert; });                                                 \
    }
// vconv_<name><suffix>: From -> To under `mode`.
#define PASA_SIM_VCONV(name, From, To, mode) PASA_SIM_VCONV_BY(name, From, To, (FloatTo<To>(Value(v), mode)))
#define PASA_SIM_VCONV_ALL(name, From, To, plain)                                                                     \
    PASA_SIM_VCONV(name, From, To, plain)                                                                             \
    PASA_SIM_VCONV(name##r, From, To, Round::kRint)                                                                   \
    PASA_SIM_VCONV(name##a, From, To, Round::kAway)                                                                   \
    PASA_SIM_VCONV(name##f, From, To, Round::kFloor)                                                                  \
    PASA_SIM_VCONV(name##c, From, To, Round::kCeil)                                                                   \
    PASA_SIM_VCONV(name##z, From, To, Round::kTrunc)

PASA_SIM_VCONV_ALL(vconv_f322f16, float, half, Round::kRint)
PASA_SIM_VCONV(vconv_f322f16o, float, half, Round::kOdd)
PASA_SIM_VCONV_ALL(vconv_f322bf16, float, bfloat16_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f322s32, float, int32_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f322s16, float, int16_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f322s64, float, int64_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f162s32, half, int32_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f162s16, half, int16_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f162s8, half, int8_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_f162u8, half, uint8_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_bf162s32, bfloat16_t, int32_t, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_s322f32, int32_t, float, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_s162f16, int16_t, half, Round::kRint)
PASA_SIM_VCONV_ALL(vconv_s642f32, int64_t, float, Round::kRint)
PASA_SIM_VCONV(vconv_f162f32, half, float, Round::kRint)
PASA_SIM_VCONV(vconv_bf162f32, bfloat16_t, float, Round::kRint)
PASA_SIM_VCONV(vconv_s162f32, int16_t, float, Round::kRint)
PASA_SIM_VCONV(vconv_u82f16, uint8_t, half, Round::kRint)
PASA_SIM_VCONV(vconv_s82f16, int8_t, half, Round::kRint)
PASA_SIM_VCONV(vconv_s322s16, int32_t, int16_t, Round::kRint)
PASA_SIM_VCONV(vconv_s322s64, int32_t, int64_t, Round::kRint)
PASA_SIM_VCONV(vconv_s642s32, int64_t, int32_t, Round::kRint)
// float -> float rounded to an integral value
#define PASA_SIM_VCONV_INTEGRAL(name, mode) PASA_SIM_VCONV_BY(name, float, float, (F32ToIntegral(v, mode)))
PASA_SIM_VCONV_INTEGRAL(vconv_f322f32r, Round::kRint)
PASA_SIM_VCONV_INTEGRAL(vconv_f322f32a, Round::kAway)
PASA_SIM_VCONV_INTEGRAL(vconv_f322f32f, Round::kFloor)
PASA_SIM_VCONV_INTEGRAL(vconv_f322f32c, Round::kCeil)
PASA_SIM_VCONV_INTEGRAL(vconv_f322f32z, Round::kTrunc)
#undef PASA_SIM_VCONV_INTEGRAL
#undef PASA_SIM_VCONV_ALL
#undef PASA_SIM_VCONV
#undef PASA_SIM_VCONV_BY

#endif
