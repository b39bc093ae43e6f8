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
  store.add(key, 1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (stay && store.add(key, 0) < readers && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace zeroshard
