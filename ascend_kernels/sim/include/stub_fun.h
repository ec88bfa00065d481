// The simulator's stand-in for the closed tikicpulib header "stub_fun.h": the instructions
// and runtime hooks that the asc-devkit headers call in a CPU-debug build, each executed by
// the simulator (one header per instruction family, in ascend_kernels/sim/).
#ifndef PASA_SIM_STUB_FUN_H
#define PASA_SIM_STUB_FUN_H

#include "stub_def.h"

#include "../sim_core.h"
#include "../sim_issue.h"
#include "../sim_scalar.h"
#include "../sim_sync.h"
#include "../sim_hooks.h"
#include "../sim_move.h"
#include "../sim_cube.h"
#include "../sim_vec.h"
#include "../sim_conv.h"
#include "../sim_reduce.h"
#include "../sim_cmpsel.h"
#include "../sim_unsimulated.h"

#endif
