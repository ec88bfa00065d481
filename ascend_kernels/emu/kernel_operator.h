// CPU emulation of the AscendC "kernel_operator.h": the one header the PASA kernel sources
// include. Build a kernel against this directory (-I ascend_kernels/emu) to run it on CPU
// threads; against the CANN toolkit to run it on an Atlas A2. Only the API subset the
// kernels use exists here, and each part checks what the hardware requires.
#pragma once

#include "emu_types.h"
#include "emu_runtime.h"
#include "emu_tensor.h"
#include "emu_tpipe.h"
#include "emu_ops_move.h"
#include "emu_ops_cube.h"
#include "emu_ops_vector.h"
#include "emu_vec_strided.h"
