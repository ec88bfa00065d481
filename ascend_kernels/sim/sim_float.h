// Number formats of the simulator: binary16, bfloat16 and binary32 conversions under each
// rounding mode of the vconv instructions, with or without saturation.
//
// Contract. Round::kRint is to nearest, ties to even; kAway to nearest, ties away from zero;
// kFloor toward -inf; kCeil toward +inf; kTrunc toward zero; kOdd to the neighbour with an odd
// last bit when inexact. A finite value beyond the target's range becomes inf where IEEE
// directed rounding gives inf (nearest modes; ceil for +, floor for -), else the largest finite
// value; with `saturate`, always the largest finite value, an infinity its signed largest
// finite value and NaN zero. NaN stays a quiet NaN otherwise. Subnormals are kept.
#ifndef PASA_SIM_FLOAT_H
#define PASA_SIM_FLOAT_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace pasa_sim {

enum class Round : uint8_t { kRint, kAway, kFloor, kCeil, kTrunc, kOdd };

inline uint32_t Bits(float f) { uint32_t x; std::memcpy(&x, &f, 4); return x; }
inline float FromBits(uint32_t x) { float f; std::memcpy(&f, &x, 4); return f; }

// q rounded to an integer value under `mode`.
inline double RoundToInteger(double q, Round mode)
{
    switch (mode) {
    case Round::kRint: return std::nearbyint(q);
    case Round::kAway: return std::round(q);
    case Round::kFloor: return std::floor(q);
    case Round::kCeil: return std::ceil(q);
    case Round::kTrunc: return std::trunc(q);
    case Round::kOdd: {
        const double t = std::trunc(q);
        if (t == q || std::fmod(t, 2.0) != 0.0) return t;
        return t + (q < 0 ? -1.0 : 1.0);
    }
    }
    return q;
}

// A binary floating format: `mant` stored fraction bits, `emin` the least normal exponent,
// `emax` the greatest.
struct Format {
    int mant;
    int emin;
    int emax;
    double MaxFinite() const { return std::ldexp(2.0 - std::ldexp(1.0, -mant), emax); }
};
constexpr Format kF16{10, -14, 15};
constexpr Format kBf16{7, -126, 127};
constexpr Format kF32{23, -126, 127};

// x (finite, exact in double) rounded to `fmt`: the value, exact in double.
inline double Quantize(double x, Format fmt, Round mode, bool saturate)
{
    if (x == 0.0) return x;
    int e = std::ilogb(x);
    if (e < fmt.emin) e = fmt.emin;
    const double ulp = std::ldexp(1.0, e - fmt.mant);
    double r = RoundToInteger(x / ulp, mode) * ulp;
    const double big = fmt.MaxFinite();
    if (std::fabs(r) > big) {
        const bool toInf = !saturate && (mode == Round::kRint || mode == Round::kAway ||
                                         (mode == Round::kCeil && x > 0) || (mode == Round::kFloor && x < 0));
        r = toInf ? std::copysign(std::numeric_limits<double>::infinity(), x) : std::copysign(big, x);
    }
    if (r == 0.0) r = std::copysign(0.0, x);
    return r;
}

// Bits of a value exactly representable in binary16 (or +-inf, NaN).
inline uint16_t ExactF16Bits(double v)
{
    const uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
    const double a = std::fabs(v);
    if (std::isnan(v)) return 0x7e00u;
    if (std::isinf(a)) return sign | 0x7c00u;
    if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(a * std::ldexp(1.0, 24));
    const int e = std::ilogb(a);
    const uint32_t frac = static_cast<uint32_t>((a / std::ldexp(1.0, e) - 1.0) * 1024.0);
    return sign | static_cast<uint16_t>(((e + 15) << 10) | frac);
}

inline float F16ToF32(uint16_t h)
{
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = std::ldexp(static_cast<float>(m), -24);
        return sign ? -v : v;
    }
    if (e == 31) return FromBits(sign | 0x7f800000u | (m << 13));
    return FromBits(sign | ((e + 112u) << 23) | (m << 13));
}

inline float Bf16ToF32(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

// A float to binary16 bits; NaN keeps its sign and the top of its payload, made quiet.
inline uint16_t F32ToF16(float f, Round mode, bool saturate = false)
{
    if (std::isnan(f)) {
        if (saturate) return 0;
        const uint32_t x = Bits(f);
        return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    }
    if (std::isinf(f)) return saturate ? ExactF16Bits(std::copysign(kF16.MaxFinite(), f)) : ExactF16Bits(f);
    return ExactF16Bits(Quantize(f, kF16, mode, saturate));
}

// A double (a scalar literal) to binary16 bits, rounded once.
inline uint16_t F64ToF16(double d, Round mode)
{
    if (std::isnan(d) || std::isinf(d)) return F32ToF16(static_cast<float>(d), mode);
    return ExactF16Bits(Quantize(d, kF16, mode, false));
}

inline uint16_t F32ToBf16(float f, Round mode, bool saturate = false)
{
    if (std::isnan(f)) return saturate ? 0 : static_cast<uint16_t>((Bits(f) >> 16) | 0x40u);
    if (std::isinf(f)) {
        const double v = saturate ? std::copysign(kBf16.MaxFinite(), f) : f;
        return static_cast<uint16_t>(Bits(static_cast<float>(v)) >> 16);
    }
    return static_cast<uint16_t>(Bits(static_cast<float>(Quantize(f, kBf16, mode, saturate))) >> 16);
}

// A float rounded to an integral float (vconv_f322f32*).
inline float F32ToIntegral(float f, Round mode)
{
    if (!std::isfinite(f)) return f;
    return static_cast<float>(std::copysign(RoundToInteger(f, mode), f));
}

// A float rounded to an integer of [lo, hi], saturating; NaN gives 0.
inline int64_t ToInteger(double v, Round mode, int64_t lo, int64_t hi)
{
    if (std::isnan(v)) return 0;
    const double r = RoundToInteger(v, mode);
    if (r <= static_cast<double>(lo)) return lo;
    if (r >= static_cast<double>(hi)) return hi;
    return static_cast<int64_t>(r);
}

}  // namespace pasa_sim

#endif
