// Scalar-unit instructions: the CTRL register and the vector mask, bit operations, system
// registers, and the configuration registers of other units.
//
// Contract: set_mask_count / set_mask_norm set / clear CTRL[56] (sim_core.h);
// set_vector_mask(high, low) sets the 128-bit mask; sbitset0/1(x, i) clear / set bit i of x;
// sff0/sff1(x) the index of the lowest 0 / 1 bit (-1 where none); bcnt0/bcnt1 the number of
// 0 / 1 bits; clz the leading zero bits. get_block_idx / get_block_num / get_subblockid /
// get_subblockdim read the launch globals. The register-setting instructions are scalar
// instructions of the per-instruction record (PIPE_S, no memory: sim_pipes.h).
#ifndef PASA_SIM_SCALAR_H
#define PASA_SIM_SCALAR_H

#include "sim_core.h"
#include "sim_pipes.h"

template <typename... A> inline int64_t get_ctrl(A...) { return static_cast<int64_t>(pasa_sim::State().ctrl); }
template <typename V> inline void set_ctrl(V v) { pasa_sim::ScalarOp("set_ctrl"); pasa_sim::State().ctrl = static_cast<uint64_t>(v); }
template <typename... A> inline void set_mask_count(A...) { pasa_sim::ScalarOp("set_mask_count"); pasa_sim::State().ctrl |= uint64_t(1) << pasa_sim::kCtrlCounterBit; }
template <typename... A> inline void set_mask_norm(A...) { pasa_sim::ScalarOp("set_mask_norm"); pasa_sim::State().ctrl &= ~(uint64_t(1) << pasa_sim::kCtrlCounterBit); }
template <typename H, typename L>
inline void set_vector_mask(H high, L low)
{
    pasa_sim::ScalarOp("set_vector_mask");
    pasa_sim::State().maskHigh = static_cast<uint64_t>(high);
    pasa_sim::State().maskLow = static_cast<uint64_t>(low);
}

template <typename X, typename I> inline int64_t sbitset0(X x, I i) { return static_cast<int64_t>(static_cast<uint64_t>(x) & ~(uint64_t(1) << (static_cast<uint64_t>(i) & 63))); }
template <typename X, typename I> inline int64_t sbitset1(X x, I i) { return static_cast<int64_t>(static_cast<uint64_t>(x) | (uint64_t(1) << (static_cast<uint64_t>(i) & 63))); }
template <typename X> inline int64_t sff1(X x) { const uint64_t v = static_cast<uint64_t>(x); return v ? __builtin_ctzll(v) : -1; }
template <typename X> inline int64_t sff0(X x) { return sff1(~static_cast<uint64_t>(x)); }
template <typename X> inline int64_t bcnt1(X x) { return __builtin_popcountll(static_cast<uint64_t>(x)); }
template <typename X> inline int64_t bcnt0(X x) { return 64 - __builtin_popcountll(static_cast<uint64_t>(x)); }
template <typename X> inline int64_t clz(X x) { const uint64_t v = static_cast<uint64_t>(x); return v ? __builtin_clzll(v) : 64; }

template <typename... A> inline int64_t get_block_idx(A...) { return block_idx; }
template <typename... A> inline int64_t get_block_num(A...) { return block_num; }
template <typename... A> inline int64_t get_subblockid(A...) { return sub_block_idx; }
template <typename... A> inline int64_t get_subblockdim(A...) { return 2; }
template <typename... A> inline int64_t get_coreid(A...) { return block_idx; }
template <typename... A> inline int64_t get_sys_cnt(A...) { return static_cast<int64_t>(pasa_sim::State().instructions); }
template <typename... A> inline int64_t get_arch_ver(A...) { return 2201; }
template <typename... A> inline int64_t get_pc(A...) { return 0; }
template <typename... A> inline int64_t get_rsvd_cnt(A...) { return 0; }
template <typename... A> inline int64_t get_status(A...) { return 0; }

template <typename V> inline void set_padding(V v) { pasa_sim::ScalarOp("set_padding"); pasa_sim::State().padding = static_cast<uint64_t>(v); }
template <typename V> inline void set_nd_para(V v) { pasa_sim::ScalarOp("set_nd_para"); pasa_sim::State().ndPara = static_cast<uint64_t>(v); }
template <typename V> inline void set_quant_pre(V v) { pasa_sim::ScalarOp("set_quant_pre"); pasa_sim::State().quantPre = static_cast<uint64_t>(v); }
template <typename V> inline void set_l1_3d_size(V v) { pasa_sim::ScalarOp("set_l1_3d_size"); pasa_sim::State().l1_3dSize = static_cast<uint64_t>(v); }
template <typename... A> inline void set_atomic_none(A...) { pasa_sim::ScalarOp("set_atomic_none"); pasa_sim::State().atomic = 0; }
template <typename... A> inline void asc_prof_start(A...) {}
template <typename... A> inline void asc_prof_stop(A...) {}
template <typename... A> inline void trap(A...) { pasa_sim::Fail("trap"); }

#endif
