// Instructions the asc-devkit headers reach that the simulator does not execute yet: each
// compiles, and aborts with its name when a kernel issues it.
#ifndef PASA_SIM_UNSIMULATED_H
#define PASA_SIM_UNSIMULATED_H

#include "sim_core.h"

namespace pasa_sim {
// The result of a scalar conversion that is not simulated: converts to any type.
struct NotSimulatedValue {
    template <typename T>
    operator T() const { return T(); }
};
}  // namespace pasa_sim

#define PASA_SIM_ABSENT(ret, name) \
    template <typename... A> inline ret name(A...) { pasa_sim::NotSimulated(#name); }
#define PASA_SIM_ABSENT_VALUE(name) \
    template <typename... A> inline pasa_sim::NotSimulatedValue name(A...) { pasa_sim::NotSimulated(#name); }

// cube path: other moves and modes
PASA_SIM_ABSENT(void, copy_cbuf_to_fbuf)
PASA_SIM_ABSENT(void, copy_cbuf_to_bt)
PASA_SIM_ABSENT(void, copy_gm_to_cbuf_multi_nd2nz_b8)
PASA_SIM_ABSENT(void, load_cbuf_to_ca_s4)
PASA_SIM_ABSENT(void, load_cbuf_to_cb_s4)
PASA_SIM_ABSENT(void, load_cbuf_to_cb_sp)
PASA_SIM_ABSENT(void, load_cbuf_to_cb_transpose_s4)
PASA_SIM_ABSENT(void, img2colv2_cbuf_to_ca)
PASA_SIM_ABSENT(void, img2colv2_cbuf_to_ca_s4)
PASA_SIM_ABSENT(void, img2colv2_cbuf_to_cb)
PASA_SIM_ABSENT(void, mad_sp)
PASA_SIM_ABSENT(void, set_fmatrix)
PASA_SIM_ABSENT(void, set_fmatrix_b)
PASA_SIM_ABSENT(void, set_l3d_rpt)
PASA_SIM_ABSENT(void, set_fpc)
PASA_SIM_ABSENT(void, set_deqscale)
// vector instructions not yet simulated
PASA_SIM_ABSENT(void, vcmpv_eq)
PASA_SIM_ABSENT(void, vcmpv_ne)
PASA_SIM_ABSENT(void, vcmpv_lt)
PASA_SIM_ABSENT(void, vcmpv_le)
PASA_SIM_ABSENT(void, vcmpv_gt)
PASA_SIM_ABSENT(void, vcmpv_ge)
PASA_SIM_ABSENT(void, vconv_deq)
PASA_SIM_ABSENT(void, vconv_s42f16)
PASA_SIM_ABSENT(void, vconv_f162s4)
PASA_SIM_ABSENT(void, vconv_f162s4a)
PASA_SIM_ABSENT(void, vconv_f162s4c)
PASA_SIM_ABSENT(void, vconv_f162s4f)
PASA_SIM_ABSENT(void, vconv_f162s4r)
PASA_SIM_ABSENT(void, vconv_f162s4z)
PASA_SIM_ABSENT(void, vconv_bf162s32a)
PASA_SIM_ABSENT(void, vmulconv_f162s8)
PASA_SIM_ABSENT(void, vmulconv_f162u8)
PASA_SIM_ABSENT(void, vshr)
PASA_SIM_ABSENT(void, vcopy)
PASA_SIM_ABSENT(void, vgather)
PASA_SIM_ABSENT(void, vreducev2)
PASA_SIM_ABSENT(void, vtranspose)
PASA_SIM_ABSENT(void, scatter_vnchwconv_b8)
PASA_SIM_ABSENT(void, scatter_vnchwconv_b16)
PASA_SIM_ABSENT(void, scatter_vnchwconv_b32)
PASA_SIM_ABSENT(void, vld_va_reg)
PASA_SIM_ABSENT(void, set_va_reg_sb)
// other units and registers
PASA_SIM_ABSENT(void, set_atomic_add)
PASA_SIM_ABSENT(void, set_atomic_max)
PASA_SIM_ABSENT(void, set_atomic_min)
PASA_SIM_ABSENT(void, set_atomic_f32)
PASA_SIM_ABSENT(void, set_atomic_f16)
PASA_SIM_ABSENT(void, set_atomic_bf16)
PASA_SIM_ABSENT(void, set_atomic_s32)
PASA_SIM_ABSENT(void, set_atomic_s16)
PASA_SIM_ABSENT(void, set_atomic_s8)
PASA_SIM_ABSENT(int64_t, get_st_atomic_cfg)
PASA_SIM_ABSENT(void, set_st_atomic_cfg)
PASA_SIM_ABSENT(int64_t, get_vms4_sr)
PASA_SIM_ABSENT(int64_t, get_icache_prl_st)
PASA_SIM_ABSENT(int64_t, get_imm)
PASA_SIM_ABSENT(int64_t, sflbits)
PASA_SIM_ABSENT(int64_t, ld_dev)
PASA_SIM_ABSENT(void, st_dev)
PASA_SIM_ABSENT(void, set_data_exp_0)
PASA_SIM_ABSENT(void, set_data_exp_1)
PASA_SIM_ABSENT(void, set_data_exp_2)
PASA_SIM_ABSENT(void, set_data_exp_3)
PASA_SIM_ABSENT(void, set_aipp_spr_0)
PASA_SIM_ABSENT(void, set_aipp_spr_1)
PASA_SIM_ABSENT(void, set_aipp_spr_2)
PASA_SIM_ABSENT(void, set_aipp_spr_3)
PASA_SIM_ABSENT(void, set_aipp_spr_4)
PASA_SIM_ABSENT(void, set_aipp_spr_5)
PASA_SIM_ABSENT(void, set_aipp_spr_6)
PASA_SIM_ABSENT(void, set_aipp_spr_7)
PASA_SIM_ABSENT(void, set_aipp_spr_8)
PASA_SIM_ABSENT(void, set_aipp_spr_9)
PASA_SIM_ABSENT(void, set_aipp_spr_18)
PASA_SIM_ABSENT(void, set_aipp_spr_19)
PASA_SIM_ABSENT(void, set_aipp_spr_20)
PASA_SIM_ABSENT(void, set_aipp_spr_21)
PASA_SIM_ABSENT(void, __ib_set_stub)
PASA_SIM_ABSENT(void, __ib_wait_stub)
PASA_SIM_ABSENT(void, __sync_all_stub)
PASA_SIM_ABSENT_VALUE(conv_f322f16o)
PASA_SIM_ABSENT_VALUE(conv_f322s32a)
PASA_SIM_ABSENT_VALUE(conv_f322s32c)
PASA_SIM_ABSENT_VALUE(conv_f322s32f)
PASA_SIM_ABSENT_VALUE(conv_f322s32r)
#undef PASA_SIM_ABSENT_VALUE
#undef PASA_SIM_ABSENT

#endif
