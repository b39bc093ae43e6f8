#include "sharding/CountedBuffer.h"

#include <utility>

#include <c10/core/StorageImpl.h>

#include "common/Error.h"

namespace zeroshard {

CountedBuffer::CountedBuffer(at::Tensor tensor, MemoryLedger* ledger, Tier tier, Kind kind,
                             int64_t counted)
    : tensor_(std::move(tensor)), entry_(ledger, tier, kind, counted) {}

void CountedBuffer::resize(int64_t bytes) {
  // The storage itself gets the new memory, so views (and tensors autograd saved) that
  // point at it see it.
  c10::StorageImpl* storage = tensor_.storage().unsafeGetStorageImpl();
  if (bytes > 0 && storage->allocator() == nullptr)
    fail("a flat buffer on {} has no allocator to bring its memory back", storage->device().str());
  at::DataPtr memory = bytes > 0 ? storage->allocator()->allocate(static_cast<size_t>(bytes))
                                 : at::DataPtr(nullptr, storage->device());
  storage->set_data_ptr_noswap(std::move(memory));
  storage->set_nbytes(static_cast<size_t>(bytes));
  entry_.resize(bytes);
}

void CountedBuffer::recount(MemoryLedger* ledger, Tier tier, Kind kind) {
  entry_ = LedgerEntry(ledger, tier, kind, entry_.bytes());
}

}  // namespace zeroshard
