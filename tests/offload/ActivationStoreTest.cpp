// ActivationStore: host blocks are counted while held or pooled, the pool reuses buffers
// and stays within the most in use at once, bytes written to NVMe come back equal, the swap file
// reuses freed regions (merged with their neighbours) and grows only past them, and a detached
// store counts no more.
#include "offload/ActivationStore.h"

#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "tests/offload/Scratch.h"

#include "common/Alignment.h"
#include "common/Error.h"

using namespace zeroshard;
using zeroshard::testing::scratch_dir;

namespace {

std::shared_ptr<ActivationStore> nvme_store(MemoryLedger* ledger, const std::string& name) {
  IoOptions o;
  o.block_size = 64 << 10;
  return std::make_shared<ActivationStore>(ledger, false, scratch_dir(name), "test", o);
}

std::shared_ptr<HostBlock> filled(ActivationStore& store, int64_t bytes, unsigned char first) {
  auto block = store.host(bytes);
  auto* b = static_cast<unsigned char*>(block->data());
  for (int64_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(first + i * 7);
  return block;
}

bool holds(const HostBlock& block, unsigned char first) {
  const auto* b = static_cast<const unsigned char*>(block.data());
  for (int64_t i = 0; i < block.bytes(); ++i)
    if (b[i] != static_cast<unsigned char>(first + i * 7)) return false;
  return true;
}

}  // namespace

TEST(ActivationStore, HostBlocksCountedWhileHeldOrPooled) {
  MemoryLedger ledger;
  auto store = std::make_shared<ActivationStore>(&ledger, false, "", "test", IoOptions{});
  EXPECT_FALSE(store->has_nvme());
  void* first = nullptr;
  {
    auto a = store->host(1000);  // rounded up to the I/O alignment: 4096
    auto b = store->host(5000);  // 8192
    first = a->data();
    EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 4096 + 8192);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % kIoAlignment, 0u);
  }
  // Released into the pool: still held, still counted; the next block of a size it holds
  // takes a pooled buffer.
  EXPECT_EQ(store->pooled_bytes(), 4096 + 8192);
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 4096 + 8192);
  {
    auto again = store->host(4000);
    EXPECT_EQ(again->data(), first);
    EXPECT_EQ(again->bytes(), 4000);
    EXPECT_EQ(store->buffers_made(), 2);
    EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 4096 + 8192);
  }
  store->release_pool();
  EXPECT_EQ(store->pooled_bytes(), 0);
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 0);
  EXPECT_EQ(ledger.snapshot().peak[1][static_cast<size_t>(Kind::Activations)], 4096 + 8192);
  EXPECT_THROW(store->write(store->host(10)), zeroshard::Error);
}

// Sizes change (a longer sequence): the pooled buffers of the old sizes make room, so the
// pool and the blocks in use together stay within the most in use at once.
TEST(ActivationStore, PoolStaysWithinTheMostInUse) {
  MemoryLedger ledger;
  auto store = std::make_shared<ActivationStore>(&ledger, false, "", "test", IoOptions{});
  const int64_t page = kIoAlignment;
  store->host(4 * page).reset();
  {
    auto a = store->host(2 * page);  // the pooled 4 pages make room
    EXPECT_EQ(store->pooled_bytes(), 0);
    auto b = store->host(2 * page);  // 4 pages in use at most so far
  }
  EXPECT_EQ(store->pooled_bytes(), 4 * page);
  {
    auto c = store->host(8 * page);  // no 8-page buffer: the pooled ones go
    EXPECT_EQ(store->pooled_bytes(), 0);
    EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 8 * page);
    auto d = store->host(8 * page);
    EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 16 * page);
  }
  EXPECT_EQ(store->pooled_bytes(), 16 * page);
  EXPECT_EQ(store->buffers_made(), 5);
  {
    auto c = store->host(8 * page);
    auto d = store->host(8 * page);
    EXPECT_EQ(store->buffers_made(), 5);  // the same step again: nothing new
  }
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 16 * page);
}

TEST(ActivationStore, NvmeRoundTripReleasesTheHostCopy) {
  MemoryLedger ledger;
  auto store = nvme_store(&ledger, "activation-roundtrip");
  const int64_t bytes = 300'001;  // not a multiple of the alignment
  const int64_t rounded = round_up(bytes, kIoAlignment);
  auto nvme = store->write(filled(*store, bytes, 3));
  nvme->written();  // the host copy it was written from is back in the pool
  EXPECT_EQ(store->pooled_bytes(), rounded);
  EXPECT_EQ(ledger.current(Tier::Nvme, Kind::Activations), rounded);
  std::memset(store->host(bytes)->data(), 0, rounded);  // the pooled buffer, overwritten
  nvme->fetch();                                        // read into the pooled buffer
  auto back = nvme->take();
  EXPECT_EQ(back->bytes(), bytes);
  EXPECT_TRUE(holds(*back, 3));
  EXPECT_EQ(store->buffers_made(), 1);
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), rounded);
  back.reset();
  EXPECT_EQ(store->pooled_bytes(), rounded);
  EXPECT_TRUE(holds(*nvme->take(), 3));  // read again after the first was handed over
  nvme.reset();
  EXPECT_EQ(ledger.current(Tier::Nvme, Kind::Activations), 0);
  store->release_pool();
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 0);
}

TEST(ActivationStore, FreedRegionsAreReusedAndMerged) {
  MemoryLedger ledger;
  auto store = nvme_store(&ledger, "activation-regions");
  const int64_t page = kIoAlignment;
  auto a = store->write(filled(*store, page, 1));
  auto b = store->write(filled(*store, 2 * page, 2));
  auto c = store->write(filled(*store, page, 3));
  EXPECT_EQ(store->file_bytes(), 4 * page);
  a.reset();
  b.reset();  // a's and b's regions merge into one of 3 pages
  auto d = store->write(filled(*store, 3 * page, 4));
  EXPECT_EQ(store->file_bytes(), 4 * page);  // fitted in the merged hole
  auto e = store->write(filled(*store, page, 5));
  EXPECT_EQ(store->file_bytes(), 5 * page);  // no hole left: the file grows
  EXPECT_TRUE(holds(*c->take(), 3));
  EXPECT_TRUE(holds(*d->take(), 4));
  EXPECT_TRUE(holds(*e->take(), 5));
}

TEST(ActivationStore, DetachedStoreCountsNoMore) {
  auto ledger = std::make_unique<MemoryLedger>();
  auto store = std::make_shared<ActivationStore>(ledger.get(), false, "", "test", IoOptions{});
  auto kept = store->host(100);
  store->detach();
  ledger.reset();  // the engine is gone; a graph still holds `kept`
  kept.reset();    // freed without touching the ledger (ASan would see it)
}
