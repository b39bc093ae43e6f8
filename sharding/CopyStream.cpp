#include "sharding/CopyStream.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace zeroshard {
namespace {

c10::Stream current_stream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

}  // namespace

bool CopyDone::ready() const {
  return !event_ || event_->query();
}

void CopyDone::wait() const {
  if (event_) event_->synchronize();
}

void CopyDone::before_current() const {
  if (event_) event_->block(current_stream(event_->device()));
}

CopyStream::CopyStream(c10::Device device) {
  if (device.is_cpu()) return;
  stream_ = c10::impl::getDeviceGuardImpl(device.type())
                ->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}

CopyDone CopyStream::on_current(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.is_cpu() && src.is_cpu()) {
    dst.copy_(src);
    return {};
  }
  const c10::Device device = dst.is_cpu() ? src.device() : dst.device();
  dst.copy_(src, /*non_blocking=*/true);
  auto done = std::make_shared<c10::Event>(device.type());
  done->record(current_stream(device));
  return CopyDone(std::move(done));
}

CopyDone CopyStream::copy(const at::Tensor& dst, const at::Tensor& src) {
  if (!stream_) {
    dst.copy_(src);
    return {};
  }
  const c10::Device device = stream_->device();
  c10::Event queued(device.type());
  queued.record(current_stream(device));
  queued.block(*stream_);
  {
    c10::StreamGuard on_copies(*stream_);
    dst.copy_(src, /*non_blocking=*/true);
  }
  // The caching allocator hands device blocks out again once the stream they were made
  // on is past them; this stream's copy must end first.
  for (const at::Tensor* t : {&dst, &src})
    if (t->device() == device) t->record_stream(*stream_);
  auto done = std::make_shared<c10::Event>(device.type());
  done->record(*stream_);
  return CopyDone(std::move(done));
}

}  // namespace zeroshard
