// The ACL implementation of the shared host launcher's runtime (pasa_launcher.h), for the NPU
// build. Allocate and Upload take memory from an AclMemory (the torch_npu binding: its caching
// allocators) and stage the uploaded bytes in page-locked host memory at once; the copies and
// launches are collected into an AclSubmission, which the caller issues on its stream: directly,
// or from torch_npu's task queue, so that they run in order with the operators queued before
// them. Issuing makes no synchronous call: aclrtMemcpyAsync and the aclrtlaunch_* functions.
#ifndef PASA_HOST_ACL_RUNTIME_H
#define PASA_HOST_ACL_RUNTIME_H

#include <cstdint>
#include <string>
#include <vector>

#include "acl/acl_base.h"
#include "pasa_launcher.h"

namespace pasa {

// Where AclLaunchRuntime gets its memory.
class AclMemory {
public:
    virtual ~AclMemory() = default;
    // `bytes` of device memory, 512-byte aligned, valid for all work queued on the stream before
    // the submission has been issued.
    virtual void* DeviceBuffer(size_t bytes) = 0;
    // `bytes` of page-locked host memory, kept by the owner until the stream has passed the
    // copies that read it.
    virtual void* PinnedHostBuffer(size_t bytes) = 0;
};

// The copies and launches of one call, in order.
class AclSubmission {
public:
    // Issue every step on `stream`. Returns ACL_SUCCESS, or the failing step's error code with
    // the step described in *failure.
    aclError Issue(aclrtStream stream, std::string* failure) const;

private:
    friend class AclLaunchRuntime;
    struct Step {
        bool isCopy = false;
        void* dst = nullptr;        // copy: device destination
        const void* src = nullptr;  // copy: page-locked host source
        size_t bytes = 0;
        PasaKernel kernel = PasaKernel::kAttention;  // launch
        uint32_t blockDim = 0;
        KernelArgs args;
    };
    std::vector<Step> steps_;
};

class AclLaunchRuntime final : public LaunchRuntime {
public:
    explicit AclLaunchRuntime(AclMemory& memory) : memory_(memory) {}
    void* Allocate(size_t bytes, BufferRole role) override;
    void Upload(void* dst, const void* src, size_t bytes) override;
    void Launch(PasaKernel kernel, uint32_t blockDim, const KernelArgs& args) override;
    // The steps collected so far (the runtime is empty afterwards).
    AclSubmission TakeSubmission();

private:
    AclMemory& memory_;
    AclSubmission pending_;
};

// AI Cores of `device` (blockDim of a MIX kernel counts AI Cores: 24 on Ascend910B1/B2, 20 on
// B3/B4), from aclrtGetDeviceInfo. Throws std::runtime_error naming the ACL error.
uint32_t AclAiCoreCount(int32_t device);

}  // namespace pasa

#endif  // PASA_HOST_ACL_RUNTIME_H
