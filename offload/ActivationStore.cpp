#include "offload/ActivationStore.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "common/Alignment.h"
#include "common/Error.h"
#include "offload/PageLock.h"
#include "offload/PinnedPool.h"

namespace zeroshard {

HostBlock::HostBlock(std::shared_ptr<ActivationStore> store, HostBuffer buffer, int64_t bytes)
    : store_(std::move(store)), buffer_(buffer), bytes_(bytes) {}

HostBlock::~HostBlock() {
  store_->give_back(buffer_);
}

NvmeBlock::NvmeBlock(std::shared_ptr<ActivationStore> store, std::shared_ptr<HostBlock> source)
    : store_(std::move(store)),
      bytes_(source->bytes()),
      length_(round_up(source->bytes(), kIoAlignment)),
      source_(std::move(source)) {
  offset_ = store_->allocate_region(length_);
  store_->count(Tier::Nvme, length_);
  write_ = store_->io_->write(store_->file_->file(), source_->data(), length_, offset_);
}

NvmeBlock::~NvmeBlock() {
  // A transfer in flight still uses the region and the buffers: it ends first.
  if (write_.valid()) write_.wait();
  if (read_.valid()) read_.wait();
  store_->count(Tier::Nvme, -length_);
  store_->free_region(offset_, length_);
}

void NvmeBlock::written() {
  if (write_.valid()) write_.get();
  source_.reset();
}

void NvmeBlock::fetch() {
  if (fetched_ != nullptr) return;
  written();
  fetched_ = store_->host(bytes_);
  read_ = store_->io_->read(store_->file_->file(), fetched_->data(), length_, offset_);
}

std::shared_ptr<HostBlock> NvmeBlock::take() {
  fetch();
  read_.get();
  // Handed over: the caller's reference is the only one, so the host bytes go when it is
  // done with them; a second take() reads the region again.
  return std::move(fetched_);
}

ActivationStore::ActivationStore(MemoryLedger* ledger, bool page_lock, const std::string& nvme_path,
                                 const std::string& tag, const IoOptions& io)
    : ledger_(ledger), page_lock_(page_lock) {
  if (nvme_path.empty()) return;
  io_ = std::make_unique<IoEngine>(io);
  dir_ = std::make_unique<SwapDir>(nvme_path, tag);
  file_ = std::make_unique<SwapFile>(dir_->path(), "activations", 0);
}

ActivationStore::~ActivationStore() {
  release_pool();
}

std::shared_ptr<HostBlock> ActivationStore::host(int64_t bytes) {
  return std::make_shared<HostBlock>(shared_from_this(), take_buffer(bytes), bytes);
}

HostBuffer ActivationStore::take_buffer(int64_t bytes) {
  const int64_t size = round_up(bytes, kIoAlignment);
  std::unique_lock<std::mutex> lock(mutex_);
  in_use_ += size;
  most_in_use_ = std::max(most_in_use_, in_use_);
  auto it = pool_.find(size);
  if (it != pool_.end()) {
    const HostBuffer buffer = it->second;
    pool_.erase(it);
    pooled_ -= size;
    return buffer;
  }
  // Sizes the steps no longer save make room for this one, so pool and blocks in use stay
  // within the most in use at once.
  while (!pool_.empty() && in_use_ + pooled_ > most_in_use_) {
    auto largest = std::prev(pool_.end());
    pooled_ -= largest->first;
    free_buffer(largest->second);
    pool_.erase(largest);
  }
  ++made_;
  const bool lock_pages = page_lock_;
  lock.unlock();  // allocating, faulting and page-locking outside the lock
  HostBuffer buffer{allocate_io_buffer(size), size, false};
  if (buffer.data == nullptr) {
    std::lock_guard<std::mutex> undo(mutex_);
    in_use_ -= size;
    fail(
        "activation_checkpointing.offload: cannot allocate {} bytes of host memory for a saved "
        "activation",
        size);
  }
  if (lock_pages) buffer.locked = page_lock(buffer.data, size);
  count(Tier::Host, size);
  return buffer;
}

void ActivationStore::give_back(HostBuffer buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_use_ -= buffer.bytes;
  if (ledger_ == nullptr || in_use_ + pooled_ + buffer.bytes > most_in_use_) {
    free_buffer(buffer);
    return;
  }
  pool_.emplace(buffer.bytes, buffer);
  pooled_ += buffer.bytes;
}

void ActivationStore::free_buffer(const HostBuffer& buffer) {
  if (buffer.locked) page_unlock(buffer.data);
  std::free(buffer.data);
  if (ledger_ != nullptr) ledger_->remove(Tier::Host, Kind::Activations, buffer.bytes);
}

int64_t ActivationStore::buffers_made() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return made_;
}

int64_t ActivationStore::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pooled_;
}

void ActivationStore::release_pool() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [size, buffer] : pool_) free_buffer(buffer);
  pool_.clear();
  pooled_ = 0;
}

std::shared_ptr<NvmeBlock> ActivationStore::write(std::shared_ptr<HostBlock> source) {
  if (!has_nvme()) fail("activation store: no nvme_path, nothing can be written to NVMe");
  return std::make_shared<NvmeBlock>(shared_from_this(), std::move(source));
}

int64_t ActivationStore::file_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_ != nullptr ? file_->bytes() : 0;
}

void ActivationStore::detach() {
  release_pool();
  std::lock_guard<std::mutex> lock(mutex_);
  ledger_ = nullptr;
}

void ActivationStore::count(Tier tier, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ledger_ == nullptr) return;
  if (bytes >= 0) {
    ledger_->add(tier, Kind::Activations, bytes);
  } else {
    ledger_->remove(tier, Kind::Activations, -bytes);
  }
}

// First fit over the free regions; past them the file grows. Activations repeat their
// sizes step after step, so the file settles at the most a step holds at once.
int64_t ActivationStore::allocate_region(int64_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < length) continue;
    const int64_t offset = it->first, rest = it->second - length;
    free_.erase(it);
    if (rest > 0) free_[offset + length] = rest;
    return offset;
  }
  const int64_t offset = end_;
  file_->grow(offset + length);
  end_ = offset + length;
  return offset;
}

void ActivationStore::free_region(int64_t offset, int64_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + length == next->first) {  // merge with the one after
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the one before
    auto before = std::prev(next);
    if (before->first + before->second == offset) {
      before->second += length;
      return;
    }
  }
  free_[offset] = length;
}

}  // namespace zeroshard
