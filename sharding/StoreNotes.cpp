#include "sharding/StoreNotes.h"

#include <chrono>
#include <thread>
#include <vector>

namespace zeroshard {

void write_note(c10d::Store& store, const std::string& key, const std::string& text) {
  store.set(key, std::vector<uint8_t>(text.begin(), text.end()));
}

std::string read_note(c10d::Store& store, const std::string& key) {
  const auto bytes = store.get(key);
  return {bytes.begin(), bytes.end()};
}

void done_reading(c10d::Store& store, const std::string& key, int readers, bool stay) {
  // The count this rank's own add returns decides first: the last reader must not ask the
  // store again, since the rank serving it may leave as soon as that count is in.
  int64_t counted = store.add(key, 1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (stay && counted < readers && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    counted = store.add(key, 0);
  }
}

}  // namespace zeroshard
