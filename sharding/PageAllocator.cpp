#include "sharding/PageAllocator.h"

#include <sys/mman.h>

#include <cstring>
#include <deque>
#include <mutex>

#include <ATen/ATen.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

struct Mapping {
  void* address;
  size_t bytes;
};

// Released mappings kept for the next allocation of the same size, at most kKept of them:
// a walk releases a unit and gathers the next, mostly of the same size, and a mapping
// reused is neither unmapped nor made and zeroed again (mapping afresh for every gather
// measured 1.5x a generation's time). What is kept is at most kKept of the largest
// buffers beside what the ledger counts.
constexpr size_t kKept = 2;

class PageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &release, cpu};
    Mapping* m = take(n);
    if (m == nullptr) {
      // MAP_POPULATE: the pages are made in one call, not one fault at a time, since
      // every caller writes the whole buffer at once (a gather).
      void* address = mmap(nullptr, n, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (address == MAP_FAILED)
        fail("could not map {} bytes of host memory: {}", n, std::strerror(errno));
      m = new Mapping{address, n};
    }
    return {m->address, m, &release, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  static PageAllocator& instance();

 private:
  Mapping* take(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if ((*it)->bytes != n) continue;
      Mapping* m = *it;
      kept_.erase(it);
      return m;
    }
    return nullptr;
  }

  void keep(Mapping* m) {
    Mapping* evicted = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      kept_.push_back(m);
      if (kept_.size() > kKept) {
        evicted = kept_.front();
        kept_.pop_front();
      }
    }
    if (evicted != nullptr) {
      munmap(evicted->address, evicted->bytes);
      delete evicted;
    }
  }

  static void release(void* context) {
    if (context != nullptr) instance().keep(static_cast<Mapping*>(context));
  }

  std::mutex mutex_;
  std::deque<Mapping*> kept_;
};

PageAllocator& PageAllocator::instance() {
  static auto* allocator = new PageAllocator;  // never destroyed: storages may outlive exit
  return *allocator;
}

}  // namespace

c10::Allocator* page_allocator() {
  return &PageAllocator::instance();
}

at::Tensor page_backed_zeros(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(options.dtype().toScalarType());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, page_allocator(),
                       /*resizable=*/true);
  at::Tensor t = at::empty({0}, options).set_(storage, 0, {numel}, {1});
  return t.zero_();  // a reused mapping holds what its last buffer left
}

}  // namespace zeroshard
