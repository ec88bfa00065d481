// NPU launcher of the PASA kernels (CANN toolkit build only; see ../CMakeLists.txt).
// Not compiled or run in this repository's CI: no CANN toolkit or NPU is available there.
//
// pasa_npu_attention(): tiling on the host, workspace and tiling on the device, then the
// preprocessing kernel (pasa: pasa_shift_keys; pasa-exact: pasa_center_keys) and the MIX
// attention kernel on `stream`, synchronously. Device pointers: query, key, value, out, lse;
// host pointers: the per-batch int32 arrays (copied to the device here).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclrtlaunch_pasa_attention.h"
#include "aclrtlaunch_pasa_center_keys.h"
#include "aclrtlaunch_pasa_shift_keys.h"
#include "pasa_tiling.h"

namespace {

struct DeviceBuffer {
    void* ptr = nullptr;
    ~DeviceBuffer()
    {
        if (ptr != nullptr) aclrtFree(ptr);
    }
};

bool Check(aclError rc, const char* what, char* err, size_t errLen)
{
    if (rc == ACL_SUCCESS) return true;
    std::snprintf(err, errLen, "%s failed with aclError %d", what, static_cast<int>(rc));
    return false;
}

bool Upload(DeviceBuffer& buf, const void* host, size_t bytes, const char* what, char* err, size_t errLen)
{
    return Check(aclrtMalloc(&buf.ptr, bytes, ACL_MEM_MALLOC_HUGE_FIRST), what, err, errLen) &&
           Check(aclrtMemcpy(buf.ptr, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE), what, err, errLen);
}

}  // namespace

// Returns 0 on success; otherwise writes a message to err.
extern "C" int pasa_npu_attention(const pasa::PasaProblem* problem, void* query, void* key, void* value,
                                  const int32_t* qLens, const int32_t* kvLens, const int32_t* nextTokens,
                                  void* out, void* lse, void* stream, char* err, size_t errLen)
{
    PasaTilingData t;
    try {
        t = pasa::ComputeTiling(*problem);
    } catch (const std::exception& e) {
        std::snprintf(err, errLen, "%s", e.what());
        return 1;
    }
    std::vector<uint8_t> workspaceInit;
    if (t.tilingKey == PASA_KEY_PASA) {  // the head of the workspace holds M^T
        workspaceInit.assign(t.keyPrimeOffset, 0);
        pasa::FillShiftMatrix(t, reinterpret_cast<uint16_t*>(workspaceInit.data() + t.shiftMatrixOffset));
    }
    DeviceBuffer ws, tiling, ql, kl, nx;
    if (!Check(aclrtMalloc(&ws.ptr, t.workspaceBytes, ACL_MEM_MALLOC_HUGE_FIRST), "workspace aclrtMalloc", err, errLen)) return 1;
    if (!workspaceInit.empty() &&
        !Check(aclrtMemcpy(ws.ptr, t.workspaceBytes, workspaceInit.data(), workspaceInit.size(), ACL_MEMCPY_HOST_TO_DEVICE),
               "shift matrix upload", err, errLen)) return 1;
    const size_t lensBytes = sizeof(int32_t) * t.batch;
    if (!Upload(tiling, &t, sizeof(t), "tiling upload", err, errLen) || !Upload(ql, qLens, lensBytes, "q_lens upload", err, errLen) ||
        !Upload(kl, kvLens, lensBytes, "kv_lens upload", err, errLen) || !Upload(nx, nextTokens, lensBytes, "next_tokens upload", err, errLen)) {
        return 1;
    }
    auto* wsp = static_cast<uint8_t*>(ws.ptr);
    auto* tp = static_cast<uint8_t*>(tiling.ptr);
    auto* qlp = static_cast<uint8_t*>(ql.ptr);
    auto* klp = static_cast<uint8_t*>(kl.ptr);
    auto* nxp = static_cast<uint8_t*>(nx.ptr);
    if (t.tilingKey == PASA_KEY_PASA) {
        ACLRT_LAUNCH_KERNEL(pasa_shift_keys)(t.blockDim, stream, key, qlp, klp, nxp, wsp, tp);
    } else if (t.tilingKey == PASA_KEY_PASA_EXACT) {
        ACLRT_LAUNCH_KERNEL(pasa_center_keys)(t.blockDim, stream, key, qlp, klp, nxp, wsp, tp);
    }
    ACLRT_LAUNCH_KERNEL(pasa_attention)(t.blockDim, stream, query, key, value, qlp, klp, nxp, out, lse, wsp, tp);
    return Check(aclrtSynchronizeStream(stream), "aclrtSynchronizeStream", err, errLen) ? 0 : 1;
}
