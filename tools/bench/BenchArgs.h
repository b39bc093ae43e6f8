#pragma once
// The benchmarks' command lines, declared once per option: flags and valued options bound
// to variables. parse() fails (zeroshard::Error) on an unknown option, a missing value or
// a value that is not a number, naming it and listing every option.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/Error.h"

namespace zeroshard::bench {

class BenchArgs {
 public:
  // A flag that sets `*out` to `value` (--json: true; --no-ddp: false).
  BenchArgs& flag(const std::string& name, bool* out, bool value = true) {
    return add(name, "", [out, value](const std::string&) { *out = value; });
  }
  BenchArgs& option(const std::string& name, std::string* out, const std::string& meta = "DIR") {
    return add(name, meta, [out](const std::string& v) { *out = v; });
  }
  BenchArgs& option(const std::string& name, int* out) {
    return add(name, "N",
               [out, name](const std::string& v) { *out = static_cast<int>(number(name, v)); });
  }
  BenchArgs& option(const std::string& name, int64_t* out) {
    return add(name, "N", [out, name](const std::string& v) { *out = number(name, v); });
  }
  // A value parsed by `set` (which may fail itself), shown as `meta` in the usage.
  BenchArgs& option(const std::string& name, const std::string& meta,
                    std::function<void(const std::string&)> set) {
    return add(name, meta, std::move(set));
  }

  void parse(int argc, char** argv, int first = 1) const {
    for (int i = first; i < argc; ++i) {
      const Entry* e = find(argv[i]);
      if (e == nullptr) fail("unknown option '{}'; allowed: {}", argv[i], usage());
      if (e->meta.empty()) {
        e->set("");
        continue;
      }
      if (i + 1 >= argc) fail("{} needs a value ({}); allowed: {}", e->name, e->meta, usage());
      e->set(argv[++i]);
    }
  }

  std::string usage() const {
    std::string out;
    for (const auto& e : entries_) {
      out += (out.empty() ? "" : " ") + ("[" + e.name + (e.meta.empty() ? "" : " " + e.meta) + "]");
    }
    return out;
  }

 private:
  struct Entry {
    std::string name;
    std::string meta;  // empty: a flag
    std::function<void(const std::string&)> set;
  };

  BenchArgs& add(const std::string& name, const std::string& meta,
                 std::function<void(const std::string&)> set) {
    entries_.push_back({name, meta, std::move(set)});
    return *this;
  }
  const Entry* find(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  static int64_t number(const std::string& name, const std::string& text) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) fail("{}: '{}' is not a whole number", name, text);
    return v;
  }

  std::vector<Entry> entries_;
};

}  // namespace zeroshard::bench
