#pragma once
// Short texts ranks leave each other in the rendezvous store: what they built, what they
// wait on, which collective they issued. Every helper here may throw where the store is
// gone; callers say what that means for them.
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace zeroshard {

void write_note(c10d::Store& store, const std::string& key, const std::string& text);
// Waits (up to the store's timeout) until the key is there.
std::string read_note(c10d::Store& store, const std::string& key);

// After a rank has read what it needs under `key`'s notes: counts it, and with `stay` waits
// (at most 5 s) until `readers` ranks have, so that a rank serving the store does not take
// it away from ranks still reading.
void done_reading(c10d::Store& store, const std::string& key, int readers, bool stay);

}  // namespace zeroshard
