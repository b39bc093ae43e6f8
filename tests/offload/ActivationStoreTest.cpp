// ActivationStore: host blocks are counted while held, bytes written to NVMe come back
// equal, the swap file reuses freed regions (merged with their neighbours) and grows only
// past them, and a detached store counts no more.
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

TEST(ActivationStore, HostBlocksCountedWhileHeld) {
  MemoryLedger ledger;
  auto store = std::make_shared<ActivationStore>(&ledger, false, "", "test", IoOptions{});
  EXPECT_FALSE(store->has_nvme());
  {
    auto a = store->host(1000);  // rounded up to the I/O alignment: 4096
    auto b = store->host(5000);  // 8192
    EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 4096 + 8192);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % kIoAlignment, 0u);
  }
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 0);
  EXPECT_EQ(ledger.snapshot().peak[1][static_cast<size_t>(Kind::Activations)], 4096 + 8192);
  EXPECT_THROW(store->write(store->host(10)), zeroshard::Error);
}

TEST(ActivationStore, NvmeRoundTripReleasesTheHostCopy) {
  MemoryLedger ledger;
  auto store = nvme_store(&ledger, "activation-roundtrip");
  const int64_t bytes = 300'001;  // not a multiple of the alignment
  auto nvme = store->write(filled(*store, bytes, 3));
  nvme->written();  // the host copy it was written from is gone
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 0);
  EXPECT_EQ(ledger.current(Tier::Nvme, Kind::Activations), round_up(bytes, kIoAlignment));
  nvme->fetch();
  auto back = nvme->take();
  EXPECT_EQ(back->bytes(), bytes);
  EXPECT_TRUE(holds(*back, 3));
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), round_up(bytes, kIoAlignment));
  back.reset();
  EXPECT_EQ(ledger.current(Tier::Host, Kind::Activations), 0);
  EXPECT_TRUE(holds(*nvme->take(), 3));  // read again after the first was handed over
  nvme.reset();
  EXPECT_EQ(ledger.current(Tier::Nvme, Kind::Activations), 0);
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
