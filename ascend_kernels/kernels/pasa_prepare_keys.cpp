// The key preprocessing launches, pasa_shift_keys (tiling key PASA) and pasa_center_keys
// (PASA_EXACT): the work of pasa_prepare_keys.h where the host forces a launch of its own
// (PasaProblem::prepLaunch); otherwise the attention launch does it (PasaTilingData::prepInAttention).
#include "pasa_prepare_keys.h"

using namespace AscendC;

extern "C" __global__ __aicore__ void pasa_shift_keys(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots,
                                                      GM_ADDR workspace, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    PasaTilingData t;
    pasa::LoadTiling(tiling, t);
    pasa::PrepareKeys(key, blockTable, keySlots, workspace, tiling, t);
}

extern "C" __global__ __aicore__ void pasa_center_keys(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots,
                                                       GM_ADDR workspace, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    PasaTilingData t;
    pasa::LoadTiling(tiling, t);
    pasa::PrepareKeys(key, blockTable, keySlots, workspace, tiling, t);
}
