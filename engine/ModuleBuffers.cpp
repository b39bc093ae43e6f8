#include "engine/ModuleBuffers.h"

#include <utility>

#include <ATen/ATen.h>

#include "common/Alignment.h"
#include "sharding/Collectives.h"

namespace zeroshard {
namespace {

// Each buffer starts on a multiple of the widest element (complex128), so its bytes in
// the flat tensor can be viewed as its own dtype.
constexpr int64_t kSlotAlignment = 16;

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// The tensor's bytes as a 1-D uint8 tensor (0-dim tensors too: num_batches_tracked).
at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().reshape({-1}).view(at::kByte);
}

}  // namespace

ModuleBuffers::ModuleBuffers(std::vector<NamedBuffer> buffers, bool broadcast, MemoryLedger* ledger)
    : buffers_(std::move(buffers)), enabled_(broadcast), ledger_(ledger) {
  for (const auto& b : buffers_) bytes_ += bytes_of(b.tensor);
  entry_ = LedgerEntry(ledger, Tier::Device, Kind::Buffers, bytes_);
}

const NamedBuffer* ModuleBuffers::find(const std::string& name) const {
  for (const auto& b : buffers_)
    if (b.name == name) return &b;
  return nullptr;
}

at::Tensor ModuleBuffers::host_bytes(const at::Tensor& buffer) {
  return as_bytes(buffer.to(at::kCPU));
}

void ModuleBuffers::assign(const at::Tensor& buffer, const at::Tensor& bytes,
                           at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const at::Tensor values = bytes.view(dtype).view(buffer.sizes());
  buffer.copy_(values);
}

void ModuleBuffers::forward_begin(Collectives& comm) {
  forwards_hooked_ = true;
  if (due_) broadcast(comm);
  due_ = false;
}

void ModuleBuffers::broadcast(Collectives& comm) {
  if (!enabled_ || buffers_.empty() || comm.world() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& b : buffers_) {
    offsets.push_back(total);
    total += round_up(bytes_of(b.tensor), kSlotAlignment);
  }
  // Counted while it lives, as the collectives' other scratch is.
  const LedgerEntry staging(ledger_, Tier::Device, Kind::CommBuckets, total);
  const auto device = buffers_.front().tensor.device();
  at::Tensor flat = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(device));
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const at::Tensor& t = buffers_[i].tensor;
    flat.narrow(0, offsets[i], bytes_of(t)).copy_(as_bytes(t));
  }
  const CollectiveLabel label("the module's buffers");
  comm.broadcast(flat, 0).wait();
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const at::Tensor& t = buffers_[i].tensor;
    assign(t, flat.narrow(0, offsets[i], bytes_of(t)), t.scalar_type());
  }
}

}  // namespace zeroshard
