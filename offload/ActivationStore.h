#pragma once
// Saved activations kept off the device from a block's forward to its backward
// (activation_checkpointing.offload; bindings/zeroshard/_activations/offload.py decides
// what and when). Host blocks are aligned for O_DIRECT and page-locked where a GPU copies
// from them. A block released goes back to the store's pool, and the next block of a size
// it holds takes its buffer: a step saves what the step before saved, so from the second
// step on nothing is mapped, faulted in or page-locked afresh. The pool keeps no more than
// the most bytes in use at once so far (what the plan counts); its buffers and those in
// use are counted in the ledger on the host tier under activations. With NVMe, a host
// block is written to a region of this rank's swap file (counted on the nvme tier while it
// holds one), released once written, and read back into a host block ahead of its
// backward.
// The store outlives the engine that made it if a graph still holds its blocks:
// detach() (the engine's destructor) stops the counting then.
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/MemoryLedger.h"
#include "offload/IoEngine.h"
#include "offload/SwapFile.h"

namespace zeroshard {

class ActivationStore;

// A buffer of host memory aligned for O_DIRECT, page-locked where `locked`.
struct HostBuffer {
  void* data = nullptr;
  int64_t bytes = 0;
  bool locked = false;
};

// One host buffer for a saved tensor's bytes, back to the store's pool when the last
// reference goes.
class HostBlock {
 public:
  HostBlock(std::shared_ptr<ActivationStore> store, HostBuffer buffer, int64_t bytes);
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  void* data() const { return buffer_.data; }
  int64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<ActivationStore> store_;
  HostBuffer buffer_;  // at least bytes_, rounded up to the I/O alignment
  int64_t bytes_;
};

// A host block's bytes in a region of the store's swap file.
class NvmeBlock {
 public:
  NvmeBlock(std::shared_ptr<ActivationStore> store, std::shared_ptr<HostBlock> source);
  ~NvmeBlock();
  NvmeBlock(const NvmeBlock&) = delete;
  NvmeBlock& operator=(const NvmeBlock&) = delete;
  // Waits for the write; the host block it was written from is released.
  void written();
  // Starts reading the bytes into a new host block (once; written() first).
  void fetch();
  // The bytes in a host block, handed to the caller: waits for the read, fetching first
  // where none was started.
  std::shared_ptr<HostBlock> take();
  int64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<ActivationStore> store_;
  int64_t bytes_;
  int64_t offset_;
  int64_t length_;  // the region's bytes, rounded up to the I/O alignment
  std::shared_ptr<HostBlock> source_;
  std::future<void> write_;
  std::shared_ptr<HostBlock> fetched_;
  std::future<void> read_;
};

class ActivationStore : public std::enable_shared_from_this<ActivationStore> {
 public:
  // `nvme_path` empty: host blocks only. `tag` names the swap directory (e.g. "rank3").
  ActivationStore(MemoryLedger* ledger, bool page_lock, const std::string& nvme_path,
                  const std::string& tag, const IoOptions& io);
  ~ActivationStore();

  // A host block of `bytes`: a pooled buffer of that size rounded up to the I/O alignment
  // where there is one, else a new one.
  std::shared_ptr<HostBlock> host(int64_t bytes);
  // Writes the block's bytes to the swap file, asynchronously.
  std::shared_ptr<NvmeBlock> write(std::shared_ptr<HostBlock> source);
  bool has_nvme() const { return file_ != nullptr; }
  int64_t file_bytes() const;
  // Host buffers made so far (taken from the pool: not counted), and the bytes the pool
  // holds now.
  int64_t buffers_made() const;
  int64_t pooled_bytes() const;
  void release_pool();  // every pooled buffer freed
  void detach();        // the ledger is going: count no more, pool no more

 private:
  friend class HostBlock;
  friend class NvmeBlock;
  void count(Tier tier, int64_t bytes);  // + held, - released
  HostBuffer take_buffer(int64_t bytes);
  void give_back(HostBuffer buffer);
  void free_buffer(const HostBuffer& buffer);  // unlocked, freed, uncounted; mutex_ held
  int64_t allocate_region(int64_t length);
  void free_region(int64_t offset, int64_t length);

  mutable std::mutex mutex_;
  MemoryLedger* ledger_;
  bool page_lock_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<SwapDir> dir_;
  std::unique_ptr<SwapFile> file_;
  std::map<int64_t, int64_t> free_;          // the file's free regions: offset -> length
  int64_t end_ = 0;                          // the file's bytes in use or free below this
  std::multimap<int64_t, HostBuffer> pool_;  // released host buffers by size
  int64_t pooled_ = 0;                       // their bytes
  int64_t in_use_ = 0;                       // host blocks' buffers' bytes
  int64_t most_in_use_ = 0;                  // at once so far: the pool's bound
  int64_t made_ = 0;
};

}  // namespace zeroshard
