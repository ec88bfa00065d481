// The cube path: GM <-> L1 moves (bursts, ND -> NZ), L1 -> L0A/L0B fractal loads, constant
// fills, mad, and the fixpipe out of L0C. Each instruction reports its pipe (MTE2: GM -> L1 and
// L1 fills; MTE1: L1 -> L0A/L0B and L0 fills; M: mad; FIX: the fixpipe; MTE3: L1 -> GM), the
// ranges it reads and writes and the quantities its cost depends on (sim_pipes.h).
//
// Layouts (16-bit operands; a fractal is 16 x 16 elements, 512 bytes; C0 = 32 bytes):
// * L1 "NZ" as Nd2Nz writes it: element (r, c) of an ND matrix at
//   (c / C0) * dstNzC0Stride * C0 + r * dstNzNStride * C0 + c % C0 elements.
// * L0A (m x k, zZ): fractal (i, j) of (M/16, K/16) at (i * K/16 + j) * 256, row-major inside.
// * L0B (k x n, Zn): fractal (i, j) of (K/16, N/16) at (i * N/16 + j) * 256, column-major inside
//   (element (kk, nn) at nn * 16 + kk).
// * L0C (m x n fp32, Nz): fractal (i, j) at (j * M/16 + i) * 256, row-major inside; a "Z block"
//   (16 columns, M rows) starts every srcStride * 16 elements for the fixpipe.
// M, K, N are m, k, n rounded up to 16.
//
// Contract.
// * copy_gm_to_cbuf_multi_nd2nz_b16/_b32s(dst, src, sid, ndNum, nValue, dValue, srcNdStride,
//   srcDValue, dstNzC0Stride, dstNzNStride, dstNzMatrixStride): matrix i from src + i *
//   srcNdStride elements to dst + i * dstNzMatrixStride elements, layout above; the columns past
//   dValue in its last C0 block are written as 0.
// * load_cbuf_to_ca/cb(dst, src, startIndex, repeat, srcStride, dstGap, sid, transpose, mode):
//   fractal startIndex + r * srcStride of src (512-byte units) to dst + r * (1 + dstGap) * 512
//   bytes, transposed (16 x 16) when `transpose` is set.
// * create_cbuf_matrix / create_ca_matrix / create_cb_matrix[_bf16](dst, config, value):
//   config = repeat | blockNum << 16 | dstGap << 32; iteration r fills blockNum blocks from
//   r * (blockNum + dstGap) blocks; a block is 32 bytes in L1 and 512 bytes in L0A/L0B.
// * mad(c, a, b, m, k, n, unitFlag, kAlign, cmatrixSource, initZero): every element of the M x N
//   fractals of c: initZero ? 0 : c, then + a(i, kk) * b(kk, j) for kk = 0 .. k-1 in order, each
//   product exact and each addition rounded to fp32. (The cube's internal order is not
//   documented; this is the order the project's emulation takes.) unitFlag: sim_unit_flag.h.
// * copy_matrix_cc_to_gm / copy_matrix_cc_to_cbuf(dst, src, sid, nSize, mSize, dstStride,
//   srcStride, unitFlag, quant, relu, channelSplit, nz2nd): element (m, n), m < mSize,
//   n < nSize, converted (NoQuant: as is; F322F16 / F322BF16: to nearest even under the core's
//   overflow mode; relu first when set) to nz2nd ? dst[m * dstStride + n] (for each of the
//   ND_PARA register's ndNum matrices: src + i * srcNdStride * 1024 bytes, dst + i * dstNdStride
//   elements) : dst[(n / 16) * dstStride * 32 bytes + (m * 16 + n % 16) elements]. unitFlag:
//   sim_unit_flag.h.
#ifndef PASA_SIM_CUBE_H
#define PASA_SIM_CUBE_H

#include <cstring>

#include "sim_core.h"
#include "sim_move.h"
#include "sim_pipes.h"

namespace pasa_sim {

template <typename T>
inline void Nd2Nz(T* dst, const T* src, uint64_t ndNum, uint64_t nValue, uint64_t dValue, uint64_t srcNdStride,
                  uint64_t srcDValue, uint64_t c0Stride, uint64_t nStride, uint64_t dstNdStride)
{
    constexpr uint64_t c0 = 32 / sizeof(T);
    ++State().instructions;
    Trace("nd2nz dst=%p src=%p nd=%llu n=%llu d=%llu srcNd=%llu srcD=%llu c0s=%llu ns=%llu dstNd=%llu", (void*)dst,
          (const void*)src, (unsigned long long)ndNum, (unsigned long long)nValue, (unsigned long long)dValue,
          (unsigned long long)srcNdStride, (unsigned long long)srcDValue, (unsigned long long)c0Stride,
          (unsigned long long)nStride, (unsigned long long)dstNdStride);
    if (Tracing() && sizeof(T) == 2) {
        for (uint64_t i = 0; i < ndNum; ++i) {
            double sum = 0;
            for (uint64_t r = 0; r < nValue; ++r) {
                for (uint64_t c = 0; c < dValue; ++c) {
                    uint16_t b;
                    std::memcpy(&b, &src[i * srcNdStride + r * srcDValue + c], 2);
                    sum += std::fabs(F16ToF32(b));
                }
            }
            Trace("  nd2nz matrix %llu: sum |x| = %g", (unsigned long long)i, sum);
        }
    }
    const uint64_t dPad = (dValue + c0 - 1) / c0 * c0;
    Begin("copy_gm_to_cbuf_multi_nd2nz", PIPE_MTE2);
    for (uint64_t i = 0; i < ndNum; ++i) {
        for (uint64_t r = 0; r < nValue; ++r) {
            Read(src + i * srcNdStride + r * srcDValue, dValue * sizeof(T));
            for (uint64_t c = 0; c < dPad; c += c0) Write(dst + i * dstNdStride + (c / c0) * c0Stride * c0 + r * nStride * c0, 32);
        }
    }
    Cost(Work::kGmRead, static_cast<double>(ndNum * nValue * dPad * sizeof(T)));
    Issue();
    for (uint64_t i = 0; i < ndNum; ++i) {
        for (uint64_t r = 0; r < nValue; ++r) {
            for (uint64_t c = 0; c < dPad; ++c) {
                T* d = dst + i * dstNdStride + (c / c0) * c0Stride * c0 + r * nStride * c0 + c % c0;
                if (c < dValue) {
                    *d = src[i * srcNdStride + r * srcDValue + c];
                } else {
                    std::memset(static_cast<void*>(d), 0, sizeof(T));
                }
            }
        }
    }
}

inline void LoadFractals(const char* name, bool toL0B, void* dst, const void* src, uint64_t elemBytes, uint64_t start,
                         uint64_t repeat, uint64_t srcStride, uint64_t dstGap, bool transpose)
{
    ++State().instructions;
    Begin(name, PIPE_MTE1);
    TouchBursts(static_cast<const uint8_t*>(src) + start * 512, repeat, 512, srcStride * 512, false);
    TouchBursts(dst, repeat, 512, (1 + dstGap) * 512, true);
    Cost(toL0B ? Work::kToL0B : Work::kToL0A, static_cast<double>(repeat * 512));
    Issue();
    Trace("load2d dst=%p src=%p start=%llu repeat=%llu srcStride=%llu dstGap=%llu transpose=%d", dst, src,
          (unsigned long long)start, (unsigned long long)repeat, (unsigned long long)srcStride,
          (unsigned long long)dstGap, (int)transpose);
    const uint64_t side = 16, cols = 512 / elemBytes / side;  // 16 x 16 for 16-bit elements
    for (uint64_t r = 0; r < repeat; ++r) {
        const uint8_t* s = static_cast<const uint8_t*>(src) + (start + r * srcStride) * 512;
        uint8_t* d = static_cast<uint8_t*>(dst) + r * (1 + dstGap) * 512;
        if (!transpose) {
            std::memmove(d, s, 512);
            continue;
        }
        if (cols != side) Fail("load_cbuf transpose of %llu-byte elements is not simulated", (unsigned long long)elemBytes);
        uint8_t tmp[512];
        for (uint64_t i = 0; i < side; ++i) {
            for (uint64_t j = 0; j < side; ++j) std::memcpy(tmp + (j * side + i) * elemBytes, s + (i * side + j) * elemBytes, elemBytes);
        }
        std::memcpy(d, tmp, 512);
    }
}

template <typename T, typename V>
inline void FillBlocks(const char* name, int pipe, Work work, T* dst, uint64_t config, V value, uint64_t blockBytes)
{
    ++State().instructions;
    Trace("fill dst=%p config=%llx unit=%llu", (void*)dst, (unsigned long long)config, (unsigned long long)blockBytes);
    const uint64_t repeat = config & 0xffff, blocks = (config >> 16) & 0xffff, gap = (config >> 32) & 0xffff;
    Begin(name, pipe);
    TouchBursts(dst, repeat, blocks * blockBytes, (blocks + gap) * blockBytes, true);
    Cost(work, static_cast<double>(repeat * blocks * blockBytes));
    Issue();
    const T v = static_cast<T>(value);
    const uint64_t per = blockBytes / sizeof(T);
    for (uint64_t r = 0; r < repeat; ++r) {
        T* base = dst + r * (blocks + gap) * per;
        for (uint64_t e = 0; e < blocks * per; ++e) base[e] = v;
    }
}

inline uint64_t Up16(uint64_t x) { return (x + 15) / 16 * 16; }

template <typename A>
inline void Mad(float* c, const A* a, const A* b, uint64_t m, uint64_t k, uint64_t n, uint64_t unitFlag, bool initZero)
{
    ++State().instructions;
    Trace("mad c=%p a=%p b=%p m=%llu k=%llu n=%llu init=%d", (void*)c, (const void*)a, (const void*)b,
          (unsigned long long)m, (unsigned long long)k, (unsigned long long)n, (int)initZero);
    const uint64_t M = Up16(m), K = Up16(k), N = Up16(n);
    Begin("mad", PIPE_M);
    Read(a, M * K * sizeof(A));
    Read(b, K * N * sizeof(A));
    if (!initZero) Read(c, M * N * sizeof(float));
    Write(c, M * N * sizeof(float));
    Cost(Work::kMad, static_cast<double>((M / 16) * (K / 16) * (N / 16)));
    Current().unitFlag = static_cast<uint8_t>(unitFlag);
    Issue();
    for (uint64_t i = 0; i < M; ++i) {
        for (uint64_t j = 0; j < N; ++j) {
            float& out = c[((j / 16) * (M / 16) + i / 16) * 256 + (i % 16) * 16 + j % 16];
            float acc = initZero ? 0.0f : out;
            for (uint64_t kk = 0; kk < k; ++kk) {
                const float x = static_cast<float>(a[((i / 16) * (K / 16) + kk / 16) * 256 + (i % 16) * 16 + kk % 16]);
                const float y = static_cast<float>(b[((kk / 16) * (N / 16) + j / 16) * 256 + (j % 16) * 16 + kk % 16]);
                acc = acc + x * y;
            }
            out = acc;
        }
    }
}

template <typename T>
inline T FixConvert(float v, uint64_t quant, bool relu)
{
    if (relu && v < 0) v = 0.0f;
    if constexpr (std::is_same<T, half>::value) {
        if (quant != F322F16) Fail("fixpipe to half with quant mode %llu is not simulated", (unsigned long long)quant);
        T h;
        h.bits = F32ToF16(v, Round::kRint, Saturating());
        return h;
    } else if constexpr (std::is_same<T, bfloat16_t>::value) {
        if (quant != F322BF16) Fail("fixpipe to bfloat16 with quant mode %llu is not simulated", (unsigned long long)quant);
        T b;
        b.bits = F32ToBf16(v, Round::kRint, Saturating());
        return b;
    } else {
        if (quant != NoQuant) Fail("fixpipe to fp32 with quant mode %llu is not simulated", (unsigned long long)quant);
        return static_cast<T>(v);
    }
}

template <typename T>
inline void Fixpipe(const char* name, T* dst, const float* src, uint64_t nSize, uint64_t mSize, uint64_t dstStride, uint64_t srcStride,
                    uint64_t unitFlag, uint64_t quant, uint64_t relu, bool channelSplit, bool nz2nd)
{
    ++State().instructions;
    Trace("fixpipe dst=%p src=%p n=%llu m=%llu dstStride=%llu srcStride=%llu quant=%llu nz2nd=%d ndPara=%llx",
          (void*)dst, (const void*)src, (unsigned long long)nSize, (unsigned long long)mSize,
          (unsigned long long)dstStride, (unsigned long long)srcStride, (unsigned long long)quant, (int)nz2nd,
          (unsigned long long)State().ndPara);
    if (channelSplit) Fail("fixpipe channel split is not simulated");
    uint64_t ndNum = 1, srcNd = 0, dstNd = 0;
    if (nz2nd) {
        const uint64_t para = State().ndPara;
        ndNum = para & 0xffff;
        srcNd = (para >> 16) & 0xffff;
        dstNd = (para >> 32) & 0xffff;
    }
    Begin(name, PIPE_FIX);
    for (uint64_t nd = 0; nd < ndNum; ++nd) {
        const uint8_t* s = reinterpret_cast<const uint8_t*>(src) + nd * srcNd * 1024;
        for (uint64_t j = 0; j < (nSize + 15) / 16; ++j) Read(s + j * srcStride * 64, mSize * 64);
        if (nz2nd) {
            for (uint64_t m = 0; m < mSize; ++m) Write(dst + nd * dstNd + m * dstStride, nSize * sizeof(T));
        } else {
            for (uint64_t j = 0; j < (nSize + 15) / 16; ++j) {
                Write(reinterpret_cast<uint8_t*>(dst) + j * dstStride * 32, mSize * 16 * sizeof(T));
            }
        }
    }
    Cost(Work::kFix, static_cast<double>(ndNum * mSize * nSize * sizeof(T)));
    Current().unitFlag = static_cast<uint8_t>(unitFlag);
    Issue();
    for (uint64_t nd = 0; nd < ndNum; ++nd) {
        const float* s = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(src) + nd * srcNd * 1024);
        for (uint64_t m = 0; m < mSize; ++m) {
            for (uint64_t n = 0; n < nSize; ++n) {
                const float v = s[((n / 16) * srcStride + m) * 16 + n % 16];
                T* d = nz2nd ? dst + nd * dstNd + m * dstStride + n
                             : reinterpret_cast<T*>(reinterpret_cast<uint8_t*>(dst) + (n / 16) * dstStride * 32) +
                                   m * 16 + n % 16;
                *d = FixConvert<T>(v, quant, relu != 0);
            }
        }
    }
    if (Tracing()) {
        for (uint64_t m0 = 0; m0 < mSize; m0 += 16) {
            double sum = 0;
            for (uint64_t m = m0; m < mSize && m < m0 + 16; ++m) {
                for (uint64_t n = 0; n < nSize; ++n) sum += std::fabs(src[((n / 16) * srcStride + m) * 16 + n % 16]);
            }
            Trace("  fixpipe rows %llu..: sum |x| = %g", (unsigned long long)m0, sum);
        }
    }
}

}  // namespace pasa_sim

template <typename D, typename S>
inline void copy_gm_to_cbuf_multi_nd2nz_b16(D* dst, S* src, uint64_t, uint64_t ndNum, uint64_t nValue, uint64_t dValue,
                                            uint64_t srcNdStride, uint64_t srcDValue, uint64_t c0Stride,
                                            uint64_t nStride, uint64_t dstNdStride)
{
    pasa_sim::Nd2Nz(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(src), ndNum, nValue, dValue,
                    srcNdStride, srcDValue, c0Stride, nStride, dstNdStride);
}

template <typename D, typename S>
inline void copy_gm_to_cbuf_multi_nd2nz_b32s(D* dst, S* src, uint64_t, uint64_t ndNum, uint64_t nValue,
                                             uint64_t dValue, uint64_t srcNdStride, uint64_t srcDValue,
                                             uint64_t c0Stride, uint64_t nStride, uint64_t dstNdStride)
{
    pasa_sim::Nd2Nz(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(src), ndNum, nValue, dValue,
                    srcNdStride, srcDValue, c0Stride, nStride, dstNdStride);
}

template <typename D, typename S, typename P>
inline void copy_gm_to_cbuf(D* dst, S* src, uint64_t, uint64_t nBurst, uint64_t lenBurst, uint64_t srcGap,
                            uint64_t dstGap, P)
{
    pasa_sim::Bursts("copy_gm_to_cbuf", PIPE_MTE2, dst, src, nBurst, lenBurst, srcGap, dstGap);
}

template <typename D, typename S>
inline void copy_cbuf_to_gm(D* dst, S* src, uint64_t, uint64_t nBurst, uint64_t lenBurst, uint64_t srcGap,
                            uint64_t dstGap)
{
    pasa_sim::Bursts("copy_cbuf_to_gm", PIPE_MTE3, dst, src, nBurst, lenBurst, srcGap, dstGap);
}

#define PASA_SIM_LOAD2D(name, toL0B)                                                                                   \
    template <typename D, typename S, typename M>                                                                    \
    inline void name(D* dst, S* src, uint64_t start, uint64_t repeat, uint64_t srcStride, uint64_t dstGap, uint64_t, \
                     uint64_t transpose, M)                                                                           \
    {                                                                                                                 \
        pasa_sim::LoadFractals(#name, toL0B, dst, src, sizeof(S), start, repeat, srcStride, dstGap, transpose != 0);  \
    }
PASA_SIM_LOAD2D(load_cbuf_to_ca, false)
PASA_SIM_LOAD2D(load_cbuf_to_cb, true)
#undef PASA_SIM_LOAD2D

#define PASA_SIM_CREATE(name, blockBytes, pipe, work)                                                                 \
    template <typename T, typename V>                                                                                 \
    inline void name(T* dst, int64_t config, V value)                                                                 \
    {                                                                                                                 \
        pasa_sim::FillBlocks(#name, pipe, work, dst, static_cast<uint64_t>(config), value, blockBytes);               \
    }
PASA_SIM_CREATE(create_cbuf_matrix, 32, PIPE_MTE2, pasa_sim::Work::kFillL1)
PASA_SIM_CREATE(create_cbuf_matrix_bf16, 32, PIPE_MTE2, pasa_sim::Work::kFillL1)
PASA_SIM_CREATE(create_ca_matrix, 512, PIPE_MTE1, pasa_sim::Work::kToL0A)
PASA_SIM_CREATE(create_ca_matrix_bf16, 512, PIPE_MTE1, pasa_sim::Work::kToL0A)
PASA_SIM_CREATE(create_cb_matrix, 512, PIPE_MTE1, pasa_sim::Work::kToL0B)
PASA_SIM_CREATE(create_cb_matrix_bf16, 512, PIPE_MTE1, pasa_sim::Work::kToL0B)
#undef PASA_SIM_CREATE

template <typename A>
inline void mad(float* c, A* a, A* b, uint64_t m, uint64_t k, uint64_t n, uint64_t unitFlag, bool, bool, bool initZero)
{
    pasa_sim::Mad(c, a, b, m, k, n, unitFlag, initZero);
}

#define PASA_SIM_FIXPIPE(name)                                                                                        \
    template <typename T, typename Q>                                                                                 \
    inline void name(T* dst, float* src, uint64_t, uint64_t nSize, uint64_t mSize, uint64_t dstStride,                \
                     uint64_t srcStride, uint64_t unitFlag, Q quant, uint64_t relu, bool channelSplit, bool nz2nd)    \
    {                                                                                                                 \
        pasa_sim::Fixpipe(#name, dst, src, nSize, mSize, dstStride, srcStride, unitFlag, static_cast<uint64_t>(quant), relu, \
                          channelSplit, nz2nd);                                                                       \
    }
PASA_SIM_FIXPIPE(copy_matrix_cc_to_gm)
PASA_SIM_FIXPIPE(copy_matrix_cc_to_cbuf)
#undef PASA_SIM_FIXPIPE

#endif
