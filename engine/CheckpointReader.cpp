#include "engine/CheckpointReader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/ranges.h>

#include "common/Error.h"

namespace zeroshard {

CheckpointReader::CheckpointReader(const std::string& dir, Manifest manifest)
    : dir_(dir + "/" + manifest.tag), manifest_(std::move(manifest)) {
  for (const auto& f : manifest_.files) {
    const std::string path = dir_ + "/" + f.name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("checkpoint: cannot open '{}': {}", path, std::strerror(errno));
    fds_.push_back(fd);
  }
  for (size_t g = 0; g < manifest_.groups.size(); ++g) {
    for (size_t p = 0; p < manifest_.groups[g].params.size(); ++p) {
      const SavedParam& saved = manifest_.groups[g].params[p];
      if (!saved.part()) {
        index_[saved.name] = {g, p};
        continue;
      }
      Parts& whole = parts_[saved.name];
      whole.whole = {saved.name, saved.whole_shape, 0, saved_numel(saved.whole_shape), -1, {}, 0};
      whole.parts.push_back({g, p});
    }
  }
  for (auto& [name, whole] : parts_) {
    const auto part = [&](const Where& w) -> const SavedParam& {
      return manifest_.groups[w.first].params[w.second];
    };
    std::sort(whole.parts.begin(), whole.parts.end(), [&](const Where& a, const Where& b) {
      return part(a).whole_offset < part(b).whole_offset;
    });
    int64_t end = 0;  // the parts end to end, every one of the same whole, nothing missing
    for (const Where& w : whole.parts) {
      const SavedParam& p = part(w);
      if (p.whole_offset != end || p.whole_shape != whole.whole.shape ||
          manifest_.groups[w.first].trainable != manifest_.groups[whole.parts[0].first].trainable) {
        fail(
            "checkpoint '{}': the parts of parameter '{}' do not make it whole (a part at element "
            "{} of [{}] where {} was expected): the manifest is damaged",
            dir_, name, p.whole_offset, fmt::join(p.whole_shape, ", "), end);
      }
      end += p.numel;
    }
    if (end != whole.whole.numel || index_.count(name)) {
      fail(
          "checkpoint '{}': parameter '{}' is saved whole and in parts, or its parts end at "
          "element {} of {}: the manifest is damaged",
          dir_, name, end, whole.whole.numel);
    }
  }
}

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_) ::close(fd);
}

const SavedParam& CheckpointReader::param(const std::string& name, size_t* group) const {
  const auto whole = parts_.find(name);
  if (whole != parts_.end()) {
    if (group != nullptr) *group = whole->second.parts.front().first;
    return whole->second.whole;
  }
  const auto it = index_.find(name);
  if (it == index_.end()) {
    fail("checkpoint '{}' has no parameter '{}' (the model has it): a different model?", dir_,
         name);
  }
  if (group != nullptr) *group = it->second.first;
  return manifest_.groups[it->second.first].params[it->second.second];
}

void CheckpointReader::read(const std::string& name, int array, int64_t begin, int64_t count,
                            float* out) const {
  const auto whole = parts_.find(name);
  if (whole == parts_.end()) {
    param(name);  // fails naming it where it is not saved
    read_saved(index_.at(name), name, array, begin, count, out);
    return;
  }
  if (begin < 0 || begin + count > whole->second.whole.numel) {
    fail("checkpoint '{}': elements {} to {} of parameter '{}' asked, it has {}", dir_, begin,
         begin + count, name, whole->second.whole.numel);
  }
  for (const Where& w : whole->second.parts) {  // the parts that [begin, begin+count) crosses
    const SavedParam& p = manifest_.groups[w.first].params[w.second];
    const int64_t lo = std::max(begin, p.whole_offset);
    const int64_t hi = std::min(begin + count, p.whole_offset + p.numel);
    if (lo < hi) read_saved(w, name, array, lo - p.whole_offset, hi - lo, out + (lo - begin));
  }
}

void CheckpointReader::read_saved(Where where, const std::string& name, int array, int64_t begin,
                                  int64_t count, float* out) const {
  const SavedGroup& g = manifest_.groups[where.first];
  const SavedParam& p = g.params[where.second];
  const int64_t S = g.shard_numel;
  const int64_t elem = g.trainable ? 4 : saved_element_size(g.dtype);
  if (array < 0 || (g.trainable ? array >= g.arrays : array > 0)) {
    fail("checkpoint '{}': parameter '{}' has no array {} (its group holds {})", dir_, name, array,
         g.trainable ? g.arrays : 1);
  }
  std::vector<char> raw;
  int64_t idx = p.offset + begin;
  while (count > 0) {
    const int64_t slice = idx / S, pos = idx % S;
    const int64_t rank = g.ranks.empty() ? slice : g.ranks.at(static_cast<size_t>(slice));
    const int64_t take = std::min(count, S - pos);
    const int64_t at = g.file_offset + (g.trainable ? array * S * 4 : 0) + pos * elem;
    raw.resize(static_cast<size_t>(take * elem));
    const ssize_t n = ::pread(fds_.at(static_cast<size_t>(rank)), raw.data(), raw.size(), at);
    if (n != static_cast<ssize_t>(raw.size())) {
      fail("checkpoint file '{}/{}': short read of '{}' at byte {}", dir_,
           manifest_.files[static_cast<size_t>(rank)].name, name, at);
    }
    if (elem == 4) {
      std::memcpy(out, raw.data(), raw.size());
    } else if (g.dtype == "bf16") {
      const auto* h = reinterpret_cast<const c10::BFloat16*>(raw.data());
      for (int64_t i = 0; i < take; ++i) out[i] = static_cast<float>(h[i]);
    } else {
      const auto* h = reinterpret_cast<const c10::Half*>(raw.data());
      for (int64_t i = 0; i < take; ++i) out[i] = static_cast<float>(h[i]);
    }
    out += take;
    idx += take;
    count -= take;
  }
}

std::string CheckpointReader::read_rng(int rank) const {
  std::string bytes(static_cast<size_t>(manifest_.rng_bytes), '\0');
  if (manifest_.rng_bytes == 0) return bytes;
  const ssize_t n =
      ::pread(fds_.at(static_cast<size_t>(rank)), bytes.data(), bytes.size(), manifest_.rng_offset);
  if (n != static_cast<ssize_t>(bytes.size()))
    fail("checkpoint: short read of rank {}'s RNG", rank);
  return bytes;
}

void CheckpointReader::read_buffer(const SavedBuffer& buffer, void* out) const {
  const ssize_t n = ::pread(fds_.at(0), out, static_cast<size_t>(buffer.bytes), buffer.offset);
  if (n != static_cast<ssize_t>(buffer.bytes)) {
    fail("checkpoint file '{}/{}': short read of buffer '{}' at byte {}", dir_,
         manifest_.files.at(0).name, buffer.name, buffer.offset);
  }
}

}  // namespace zeroshard
