#pragma once
// Copies between a GPU and host memory on a stream of their own, so that neither the
// training thread nor the compute stream waits for them while backward and the
// optimizer go on (docs/architecture.md, "Copies between the GPU and the host").
// Order comes from events, never from synchronising the device:
//   - a copy starts after everything the calling thread's current stream has queued so
//     far (the kernels that wrote its source, or still read its destination);
//   - the CopyDone it returns says when it has ended: wait() blocks the host (before
//     the host reads what came from the device); before_current() makes the current
//     stream wait, and not the host (before kernels read what came from the host).
// Device memory a copy reads or writes is kept from reuse until the copy ends
// (record_stream); host memory from torch's caching host allocator is kept likewise,
// so a staging tensor may be dropped as soon as its copy is issued.
// On the host (no GPU) a copy is a plain synchronous one, done when it returns.
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace c10 {
struct Event;
}

namespace zeroshard {

class CopyDone {
 public:
  CopyDone() = default;  // already done
  bool ready() const;
  void wait() const;            // the host waits
  void before_current() const;  // the calling thread's current stream waits

 private:
  friend class CopyStream;
  explicit CopyDone(std::shared_ptr<c10::Event> event) : event_(std::move(event)) {}
  std::shared_ptr<c10::Event> event_;  // none: done
};

class CopyStream {
 public:
  // `device`: the GPU the copies go to or come from; on the host every copy is synchronous.
  explicit CopyStream(c10::Device device);
  // dst <- src, one of them on the device, after the current stream's queued work.
  CopyDone copy(const at::Tensor& dst, const at::Tensor& src);
  // dst <- src on the calling thread's current stream itself, without the host waiting
  // (src page-locked host memory, dst on the device); on the host a plain copy.
  static CopyDone on_current(const at::Tensor& dst, const at::Tensor& src);
  bool on_device() const { return stream_.has_value(); }

 private:
  std::optional<c10::Stream> stream_;
};

}  // namespace zeroshard
