// The simulator's stand-in for the closed tikicpulib header "stub_def.h" of a CPU-debug
// AscendC build: the device compiler's built-ins only (address-space qualifiers, function
// attributes, the scalar types half and bfloat16_t, pipe/event and operand enums, the
// core-index globals). No AscendC API is declared here; the asc-devkit headers declare it.
#ifndef PASA_SIM_STUB_DEF_H
#define PASA_SIM_STUB_DEF_H

#include <cassert>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "../sim_float.h"

// ---- function attributes and address-space qualifiers (no meaning on the CPU)
#define __aicore__
#define __global__
#define __gm__
#define __ubuf__
#define __cbuf__
#define __ca__
#define __cb__
#define __cc__
#define __fbuf__
#define __sbuf__
#define __ssbuf__
#define __biasbuf__
#define __simd_callee__
#define __simd_vf__
#define __host_aicore__
#define __simt_callee__
#define __BLOCK_LOCAL__
#define __WORKGROUP_LOCAL__
#define __inout_pipe__(...)
#define __in_pipe__(...)
#define __out_pipe__(...)
#define __sync_alias__
#define __sync_noalias__
#define __check_sync_alias__
#define __sync_in__
#define __sync_out__
#define __host__
#define ASCENDC_HOST_AICORE
#define __disable_kernel_type_autoinfer__

// ---- scalar types of the device compiler: IEEE binary16 and bfloat16 storage; a value
// converts from any arithmetic type rounding to nearest even, and to float exactly.
struct half {
    uint16_t bits = 0;
    half() = default;
    template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
    half(T v) : bits(pasa_sim::F64ToF16(static_cast<double>(v), pasa_sim::Round::kRint)) {}
    operator float() const { return pasa_sim::F16ToF32(bits); }
    float ToFloat() const { return pasa_sim::F16ToF32(bits); }
    half operator-() const { half r; r.bits = bits ^ 0x8000u; return r; }
    half& operator+=(const half& o) { return *this = half(float(*this) + float(o)); }
    half& operator-=(const half& o) { return *this = half(float(*this) - float(o)); }
    half& operator*=(const half& o) { return *this = half(float(*this) * float(o)); }
    half& operator/=(const half& o) { return *this = half(float(*this) / float(o)); }
};
struct bfloat16_t {
    uint16_t bits = 0;
    bfloat16_t() = default;
    template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
    bfloat16_t(T v) : bits(pasa_sim::F32ToBf16(static_cast<float>(v), pasa_sim::Round::kRint)) {}
    operator float() const { return pasa_sim::Bf16ToF32(bits); }
    float ToFloat() const { return pasa_sim::Bf16ToF32(bits); }
    bfloat16_t operator-() const { bfloat16_t r; r.bits = bits ^ 0x8000u; return r; }
};
// 8- and 4-bit float storage types the headers name (not simulated).
template <int Tag>
struct pasa_sim_small_float {
    uint8_t bits = 0;
    pasa_sim_small_float() = default;
    template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
    pasa_sim_small_float(T) {}
    operator float() const { return 0.0f; }
};
using fp8_e4m3fn_t = pasa_sim_small_float<1>;
using fp8_e5m2_t = pasa_sim_small_float<2>;
using fp8_e8m0_t = pasa_sim_small_float<3>;
using fp4x2_e1m2_t = pasa_sim_small_float<4>;
using fp4x2_e2m1_t = pasa_sim_small_float<5>;
using hifloat8_t = pasa_sim_small_float<6>;

// ---- pipes, events and instruction operand enums of the device compiler
enum pipe_t : uint8_t {
    PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5, PIPE_V2, PIPE_FIX,
    VIRTUAL_PIPE_MTE2_L1A, VIRTUAL_PIPE_MTE2_L1B, PIPE_NUM
};
enum event_t : int32_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
enum QuantMode_t : uint8_t {
    NoQuant = 0, F322F16, F322BF16, DEQF16, VDEQF16, DEQS16, VDEQS16, QF322B8_PRE, VQF322B8_PRE, REQ8, VREQ8, REQ4, VREQ4,
    QF162B8_PRE, VQF162B8_PRE, QF162S16_PRE, VQF162S16_PRE, QF162S4_PRE, VQF162S4_PRE, QF322BF16_PRE, VQF322BF16_PRE,
    QF322F16_PRE, VQF322F16_PRE, QF322F32_PRE, VQF322F32_PRE, QF322FP8_PRE, VQF322FP8_PRE, QF322HIF8_PRE, VQF322HIF8_PRE,
    QF322HIF8_PRE_HYBRID, VQF322HIF8_PRE_HYBRID, QS322BF16_PRE, VQS322BF16_PRE
};
enum class pad_t : uint8_t { PAD_NONE = 0, PAD_MODE1, PAD_MODE2, PAD_MODE3, PAD_MODE4, PAD_MODE5, PAD_MODE6, PAD_MODE7, PAD_MODE8 };
enum atomic_type_t : uint8_t { ATOMIC_NONE = 0, ATOMIC_F32, ATOMIC_F16, ATOMIC_S16, ATOMIC_S32, ATOMIC_S8, ATOMIC_BF16 };
enum atomic_op_t : uint8_t { ATOMIC_SUM = 0, ATOMIC_MAX, ATOMIC_MIN };
enum addr_cal_mode_t : uint8_t { inc = 0, dec = 1 };
enum class cache_line_t : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class dcci_dst_t : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
enum mem_dsb_t : uint8_t { DSB_ALL = 0, DSB_DDR, DSB_UB, DSB_SEQ };
enum mem_t : uint8_t { L1 = 0, L0A, L0B, L0C, UB, BT };
enum class Order_t : uint8_t { VALUE_INDEX = 0, INDEX_VALUE, ONLY_VALUE, ONLY_INDEX };
enum ub_addr8_t : uint8_t { VA0 = 0, VA1, VA2, VA3, VA4, VA5, VA6, VA7 };
enum vpart_t : uint8_t { L128 = 0, H128 };

// register-vector types of another architecture, named by headers included on every one
struct vector_bool {};
struct vector_align {};
struct vector_address {};

namespace bisheng { namespace cce { inline void metrics_prof_start() {} inline void metrics_prof_stop() {} } }

// ---- globals of the CPU-debug runtime (defined in sim_globals.h)
extern int32_t g_coreType;
extern int64_t block_idx;
extern int64_t block_num;
extern int64_t sub_block_idx;
extern uint64_t g_fixpipeNdNzParam;
extern int64_t g_taskRation;
namespace AscendC {
constexpr int32_t AIC_TYPE = 1;
constexpr int32_t AIV_TYPE = 2;
extern bool g_isVdeq;
}  // namespace AscendC

#endif
