#pragma once
// Saved activations kept off the device from a block's forward to its backward
// (activation_checkpointing.offload; bindings/zeroshard/_activations/offload.py decides
// what and when). Host blocks are aligned for O_DIRECT and page-locked where a GPU copies
// from them; each is counted in the ledger on the host tier under activations while it
// holds a saved tensor. With NVMe, a host block is written to a region of this rank's
// swap file (counted on the nvme tier while it holds one), released once written, and
// read back into a new host block ahead of its backward.
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

// One host buffer, freed (and uncounted) when the last reference goes.
class HostBlock {
 public:
  HostBlock(std::shared_ptr<ActivationStore> store, int64_t bytes);
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<ActivationStore> store_;
  void* data_ = nullptr;
  int64_t bytes_;
  int64_t allocated_;  // rounded up to the I/O alignment
  bool locked_ = false;
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

  std::shared_ptr<HostBlock> host(int64_t bytes);
  // Writes the block's bytes to the swap file, asynchronously.
  std::shared_ptr<NvmeBlock> write(std::shared_ptr<HostBlock> source);
  bool has_nvme() const { return file_ != nullptr; }
  int64_t file_bytes() const;
  void detach();  // the ledger is going: count no more

 private:
  friend class HostBlock;
  friend class NvmeBlock;
  void count(Tier tier, int64_t bytes);  // + held, - released
  int64_t allocate_region(int64_t length);
  void free_region(int64_t offset, int64_t length);

  mutable std::mutex mutex_;
  MemoryLedger* ledger_;
  bool page_lock_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<SwapDir> dir_;
  std::unique_ptr<SwapFile> file_;
  std::map<int64_t, int64_t> free_;  // the file's free regions: offset -> length
  int64_t end_ = 0;                  // the file's bytes in use or free below this
};

}  // namespace zeroshard
