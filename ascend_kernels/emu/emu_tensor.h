// GlobalTensor and LocalTensor of the AscendC CPU emulation (emu_tpipe.h: TPipe, TQue, TBuf
// and the system queries). Signatures follow include/basic_api/kernel_tensor.h of asc-devkit;
// the bodies add the checks the hardware implies (capacity, alignment).
#pragma once

#include "emu_runtime.h"

namespace AscendC {

template <typename T>
class LocalTensor;

namespace emu {
// One buffer handed out by a TQue or TBuf: its place and the queue-ordering snapshots.
struct BufferSlot {
    Hardware hw = Hardware::MAX;
    uint32_t offset = 0;
    uint32_t bytes = 0;
    enum State { FREE, ALLOCATED, ENQUEUED, DEQUEUED } state = FREE;
    bool everUsed = false;
    int8_t heldEvent = -1;  // the TPipe event ID it holds (EnQue..DeQue, FreeTensor..AllocTensor)
    Clock freed{};     // snapshot of the consumer pipe at FreeTensor
    Clock enqueued{};  // snapshot of the producer pipe at EnQue
    double freedAt = 0, enqueuedAt = 0;  // the same events in the timing model
};

// (producer pipe, consumer pipe) of the hardware event behind a queue position.
inline void QueuePipes(TPosition pos, int& producer, int& consumer)
{
    switch (pos) {
        case TPosition::VECIN: producer = P_MTE2; consumer = P_V; return;
        case TPosition::VECOUT: producer = P_V; consumer = P_MTE3; return;
        case TPosition::VECCALC: producer = P_V; consumer = P_V; return;
        case TPosition::A1: case TPosition::B1: producer = P_MTE2; consumer = P_MTE1; return;
        case TPosition::A2: case TPosition::B2: producer = P_MTE1; consumer = P_M; return;
        case TPosition::CO1: producer = P_M; consumer = P_FIX; return;
        default: producer = consumer = -1; return;
    }
}

// The hardware event from pipe `src` to pipe `dst` (EventPipes's inverse; MAX where none).
inline HardEvent EventBetween(int src, int dst)
{
    for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
        int s, d;
        EventPipes(static_cast<HardEvent>(e), s, d);
        if (s == src && d == dst) return static_cast<HardEvent>(e);
    }
    return HardEvent::MAX;
}

// The hardware events of a queue position (between its QueuePipes): forward (EnQue -> DeQue)
// and backward (FreeTensor -> the next AllocTensor), as GetQueEvt of kernel_event.h names them;
// MAX where the producer is the consumer.
inline void QueueEvents(TPosition pos, HardEvent& forward, HardEvent& backward)
{
    int producer, consumer;
    QueuePipes(pos, producer, consumer);
    const bool none = producer < 0 || producer == consumer;
    forward = none ? HardEvent::MAX : EventBetween(producer, consumer);
    backward = none ? HardEvent::MAX : EventBetween(consumer, producer);
}

// "MTE1_MTE2" for HardEvent::MTE1_MTE2, as the flag errors name events.
inline std::string EventName(HardEvent evt)
{
    int src, dst;
    EventPipes(evt, src, dst);
    return std::string(PipeShort(src)) + "_" + PipeShort(dst);
}

// TPipe's event-ID pool: 8 IDs per HardEvent on this core (QUE_MAX_EVENT), shared by
// TPipe::AllocEventID and the queues, which hold one per buffer between EnQue and DeQue and
// between FreeTensor and the buffer's next AllocTensor (kernel_tquebind_impl.h).
// byQueue: a queue takes the ID and sets its flag (kept in CoreCtx::queueFlag, which explicit
// SetFlag/WaitFlag on that ID refuse).
inline int8_t TakeEventId(HardEvent evt, const char* what, bool byQueue = false)
{
    CoreCtx& c = Core();
    bool* used = c.eventIdUsed[static_cast<int>(evt)];
    for (int id = 0; id < kEventIds; ++id) {
        if (!used[id]) {
            used[id] = true;
            c.queueFlag[static_cast<int>(evt)][id] = byQueue;
            return static_cast<int8_t>(id);
        }
    }
    Fail("%s: all 8 event IDs of HardEvent::%s are held (TPipe allows 8 per HardEvent; each queue buffer holds one "
         "from EnQue to DeQue and from FreeTensor to its next AllocTensor)", what, EventName(evt).c_str());
}
inline void GiveEventId(HardEvent evt, int8_t id, const char* what)
{
    CoreCtx& c = Core();
    bool* used = c.eventIdUsed[static_cast<int>(evt)];
    if (id < 0 || id >= kEventIds || !used[id]) Fail("%s: event ID %d of HardEvent::%s is not held", what, id, EventName(evt).c_str());
    used[id] = false;
    c.queueFlag[static_cast<int>(evt)][id] = false;
}

struct PipeState {
    uint32_t next[static_cast<int>(Hardware::MAX)] = {};
};
inline thread_local PipeState* tls_pipe = nullptr;

inline uint32_t AllocateLocal(TPosition pos, uint32_t bytes, const char* what)
{
    CoreCtx& c = Core();
    if (tls_pipe == nullptr) Fail("%s: no TPipe exists on this core; construct a TPipe first", what);
    const Hardware hw = PositionHardware(pos);
    if (hw == Hardware::MAX) Fail("%s: TPosition %d has no local memory in this emulation", what, static_cast<int>(pos));
    if (!c.Has(hw)) {
        Fail("%s: TPosition %s lives in %s, which an %s core does not have", what, PositionName(pos), HardwareName(hw),
             c.type == AIC ? "AIC" : "AIV");
    }
    const uint32_t aligned = (bytes + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
    uint32_t& next = tls_pipe->next[static_cast<int>(hw)];
    const uint64_t end = static_cast<uint64_t>(next) + aligned;
    if (end > TpipeCapacity(hw)) {
        Fail("%s: %s over capacity: %u bytes requested with %u already allocated, capacity %u bytes", what,
             HardwareName(hw), aligned, next, TpipeCapacity(hw));
    }
    const uint32_t off = next;
    next = static_cast<uint32_t>(end);
    return off;
}
}  // namespace emu

// ------------------------------------------------------------------ GlobalTensor
template <typename T>
class GlobalTensor {
public:
    using PrimType = T;
    GlobalTensor() {}
    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize)
    {
        address_ = buffer;
        bufferSize_ = bufferSize;
    }
    void SetGlobalBuffer(__gm__ T* buffer)
    {
        address_ = buffer;
        bufferSize_ = 0;
    }
    const __gm__ T* GetPhyAddr() const { return address_; }
    __gm__ T* GetPhyAddr(const uint64_t offset) const { return address_ + offset; }
    T GetValue(const uint64_t offset) const
    {
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::ScalarGmAccess(address_ + offset, sizeof(T));
        emu::TouchGm(emu::P_S, seq, address_ + offset, sizeof(T), false, "GlobalTensor::GetValue");
        return address_[offset];
    }
    void SetValue(const uint64_t offset, T value)
    {
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::ScalarGmAccess(address_ + offset, sizeof(T));
        emu::TouchGm(emu::P_S, seq, address_ + offset, sizeof(T), true, "GlobalTensor::SetValue");
        address_[offset] = value;
    }
    uint64_t GetSize() const { return bufferSize_; }
    GlobalTensor operator[](const uint64_t offset) const
    {
        GlobalTensor r;
        r.address_ = address_ + offset;
        r.bufferSize_ = bufferSize_ > offset ? bufferSize_ - offset : 0;
        return r;
    }

    T* address_ = nullptr;
    uint64_t bufferSize_ = 0;
};

// ------------------------------------------------------------------ LocalTensor
template <typename T>
class LocalTensor {
public:
    using PrimType = T;
    LocalTensor() {}

    TPosition GetPosition() const { return pos_; }
    uint32_t GetSize() const { return size_; }
    void SetSize(const uint32_t size)
    {
        if (size > capacity_) emu::Fail("LocalTensor::SetSize(%u) exceeds the %u elements of its buffer", size, capacity_);
        size_ = size;
    }

    LocalTensor operator[](const uint32_t offset) const
    {
        if (offset > size_) emu::Fail("LocalTensor::operator[](%u) beyond the tensor's %u elements", offset, size_);
        LocalTensor r = *this;
        r.byteOffset_ += offset * sizeof(T);
        r.size_ = size_ - offset;
        r.capacity_ = capacity_ - offset;
        return r;
    }

    template <typename U>
    LocalTensor<U> ReinterpretCast() const
    {
        LocalTensor<U> r;
        r.core_ = core_;
        r.pos_ = pos_;
        r.hw_ = hw_;
        r.byteOffset_ = byteOffset_;
        r.size_ = static_cast<uint32_t>(static_cast<uint64_t>(size_) * sizeof(T) / sizeof(U));
        r.capacity_ = static_cast<uint32_t>(static_cast<uint64_t>(capacity_) * sizeof(T) / sizeof(U));
        r.slot_ = slot_;
        return r;
    }

    T GetValue(const uint32_t index) const
    {
        CheckScalar(index, "LocalTensor::GetValue");
        emu::ScalarUbAccess(emu::PipesTouching(hw_, byteOffset_ + index * sizeof(T), sizeof(T), false));
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::TouchLocal(emu::P_S, seq, hw_, byteOffset_ + index * sizeof(T), sizeof(T), false, "LocalTensor::GetValue");
        emu::Core().stats.scalar_ub_accesses++;
        T v;
        std::memcpy(&v, Raw() + index * sizeof(T), sizeof(T));
        return v;
    }
    template <typename S>
    void SetValue(const uint32_t index, const S value) const
    {
        CheckScalar(index, "LocalTensor::SetValue");
        emu::ScalarUbAccess(emu::PipesTouching(hw_, byteOffset_ + index * sizeof(T), sizeof(T), true));
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::TouchLocal(emu::P_S, seq, hw_, byteOffset_ + index * sizeof(T), sizeof(T), true, "LocalTensor::SetValue");
        emu::Core().stats.scalar_ub_accesses++;
        const T v = static_cast<T>(value);
        std::memcpy(Raw() + index * sizeof(T), &v, sizeof(T));
    }

    // ---- emulation internals
    uint8_t* Raw() const
    {
        if (core_ == nullptr) emu::Fail("use of a LocalTensor that was never allocated from a TQue or TBuf");
        if (core_ != emu::tls_core) emu::Fail("a LocalTensor of another core is used here");
        return core_->mem[static_cast<int>(hw_)].data() + byteOffset_;
    }
    T* Data() const { return reinterpret_cast<T*>(Raw()); }
    uint32_t ByteOffset() const { return byteOffset_; }
    Hardware HardwareKind() const { return hw_; }

    void CheckScalar(uint32_t index, const char* op) const
    {
        if (hw_ != Hardware::UB) emu::Fail("%s: scalar access is only emulated for UB tensors", op);
        if (index >= size_) emu::Fail("%s(%u): index beyond the tensor's %u elements", op, index, size_);
    }

    emu::CoreCtx* core_ = nullptr;
    TPosition pos_ = TPosition::MAX;
    Hardware hw_ = Hardware::MAX;
    uint32_t byteOffset_ = 0;
    uint32_t size_ = 0;      // elements visible through this tensor
    uint32_t capacity_ = 0;  // elements up to the end of its buffer
    emu::BufferSlot* slot_ = nullptr;
};

namespace emu {
template <typename T>
LocalTensor<T> MakeTensor(TPosition pos, BufferSlot* slot, uint32_t byteOffset, uint32_t bytes)
{
    LocalTensor<T> t;
    t.core_ = &Core();
    t.pos_ = pos;
    t.hw_ = PositionHardware(pos);
    t.byteOffset_ = byteOffset;
    t.size_ = bytes / sizeof(T);
    t.capacity_ = t.size_;
    t.slot_ = slot;
    return t;
}
}  // namespace emu

}  // namespace AscendC
