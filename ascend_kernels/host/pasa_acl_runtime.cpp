// The ACL runtime of the shared host launcher (see pasa_acl_runtime.h).
#include "pasa_acl_runtime.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "acl/acl.h"
#include "aclrtlaunch_pasa_attention.h"
#include "aclrtlaunch_pasa_center_keys.h"
#include "aclrtlaunch_pasa_merge_splits.h"
#include "aclrtlaunch_pasa_shift_keys.h"

namespace pasa {
namespace {

// The kernel's aclrtlaunch_* stub with the arguments its signature lists, in its order.
uint32_t LaunchKernel(PasaKernel kernel, uint32_t blockDim, aclrtStream stream, const KernelArgs& a)
{
    switch (kernel) {
        case PasaKernel::kShiftKeys:
            return ACLRT_LAUNCH_KERNEL(pasa_shift_keys)(blockDim, stream, a.key, a.blockTable, a.keySlots, a.workspace,
                                                        a.tiling);
        case PasaKernel::kCenterKeys:
            return ACLRT_LAUNCH_KERNEL(pasa_center_keys)(blockDim, stream, a.key, a.blockTable, a.keySlots, a.workspace,
                                                         a.tiling);
        case PasaKernel::kAttention:
            return ACLRT_LAUNCH_KERNEL(pasa_attention)(blockDim, stream, a.query, a.key, a.value, a.mask, a.blockTable,
                                                       a.keySlots, a.sink, a.out, a.lse, a.rowFlags, a.workspace, a.tiling);
        case PasaKernel::kMerge:
            return ACLRT_LAUNCH_KERNEL(pasa_merge_splits)(blockDim, stream, a.sink, a.out, a.lse, a.rowFlags, a.workspace,
                                                          a.tiling);
    }
    return ACL_ERROR_INVALID_PARAM;
}

}  // namespace

void* AclLaunchRuntime::Allocate(size_t bytes, BufferRole role)
{
    void* p = memory_.DeviceBuffer(bytes);
    if (p == nullptr) throw std::runtime_error(std::string("no device memory for the ") + BufferName(role));
    return p;
}

void AclLaunchRuntime::Upload(void* dst, const void* src, size_t bytes)
{
    void* staged = memory_.PinnedHostBuffer(bytes);
    if (staged == nullptr) throw std::runtime_error("no page-locked host memory for an upload");
    std::memcpy(staged, src, bytes);
    AclSubmission::Step step;
    step.isCopy = true;
    step.dst = dst;
    step.src = staged;
    step.bytes = bytes;
    pending_.steps_.push_back(step);
}

void AclLaunchRuntime::Launch(PasaKernel kernel, uint32_t blockDim, const KernelArgs& args)
{
    AclSubmission::Step step;
    step.kernel = kernel;
    step.blockDim = blockDim;
    step.args = args;
    pending_.steps_.push_back(step);
}

AclSubmission AclLaunchRuntime::TakeSubmission()
{
    AclSubmission taken;
    std::swap(taken, pending_);
    return taken;
}

aclError AclSubmission::Issue(aclrtStream stream, std::string* failure) const
{
    for (const Step& s : steps_) {
        if (s.isCopy) {
            const aclError rc = aclrtMemcpyAsync(s.dst, s.bytes, s.src, s.bytes, ACL_MEMCPY_HOST_TO_DEVICE, stream);
            if (rc != ACL_SUCCESS) {
                *failure = "aclrtMemcpyAsync of " + std::to_string(s.bytes) + " bytes failed with aclError " +
                           std::to_string(rc);
                return rc;
            }
            continue;
        }
        const uint32_t rc = LaunchKernel(s.kernel, s.blockDim, stream, s.args);
        if (rc != 0) {
            *failure = std::string("aclrtlaunch_") + KernelName(s.kernel) + " on " + std::to_string(s.blockDim) +
                       " AI Cores failed with error " + std::to_string(rc);
            return static_cast<aclError>(rc);
        }
    }
    return ACL_SUCCESS;
}

uint32_t AclAiCoreCount(int32_t device)
{
    int64_t cores = 0;
    const aclError rc = aclrtGetDeviceInfo(static_cast<uint32_t>(device), ACL_DEV_ATTR_AICORE_CORE_NUM, &cores);
    if (rc != ACL_SUCCESS || cores <= 0) {
        throw std::runtime_error("aclrtGetDeviceInfo(ACL_DEV_ATTR_AICORE_CORE_NUM) for device " + std::to_string(device) +
                                 " failed with aclError " + std::to_string(rc) + " (" + std::to_string(cores) +
                                 " cores)");
    }
    return static_cast<uint32_t>(cores);
}

}  // namespace pasa
