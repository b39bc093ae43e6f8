#include "engine/ReslicedCheckpoint.h"

#include <algorithm>
#include <utility>

#include <fmt/ranges.h>

#include "common/Error.h"

namespace zeroshard {

ReslicedCheckpoint::ReslicedCheckpoint(std::vector<std::unique_ptr<CheckpointReader>> parts,
                                       int size, int coordinate,
                                       const std::unordered_map<std::string, int>& split_dims,
                                       const std::string& dir, const std::string& tag)
    : parts_(std::move(parts)), manifest_(parts_.at(0)->manifest()), origin_(dir + "/" + tag) {
  manifest_.tag = tag;
  const int64_t saved_size = static_cast<int64_t>(parts_.size());
  for (size_t g = 0; g < manifest_.groups.size(); ++g) {
    for (size_t i = 0; i < manifest_.groups[g].params.size(); ++i) {
      SavedParam& p = manifest_.groups[g].params[i];
      if (p.part()) {  // saved in parts (split experts): the reader joins them, read it whole
        p.shape = p.whole_shape;
        p.numel = parts_[0]->param(p.name).numel;
        p.whole_shape.clear();
      }
      for (size_t t = 1; t < parts_.size(); ++t) {
        const CheckpointReader& other = *parts_[t];
        const SavedParam* theirs = other.has_param(p.name) ? &other.param(p.name) : nullptr;
        if (theirs == nullptr || theirs->shape != p.shape ||
            theirs->tensor_parallel_dim != p.tensor_parallel_dim) {
          fail(
              "checkpoint '{}': tensor-parallel part {} does not hold parameter '{}' as part 0 "
              "does (shape [{}], split along {}); the parts are not of one save",
              origin_, t, p.name, fmt::join(p.shape, ", "), p.tensor_parallel_dim);
        }
      }
      std::vector<int64_t> whole = p.shape;
      const int saved_dim = p.tensor_parallel_dim;
      if (saved_dim >= 0) whole[static_cast<size_t>(saved_dim)] *= saved_size;
      const auto it = split_dims.find(p.name);
      const int dim = size > 1 && it != split_dims.end() ? it->second : -1;
      if (dim >= static_cast<int>(whole.size()) ||
          (dim >= 0 && saved_dim >= 0 && dim != saved_dim)) {
        fail(
            "checkpoint '{}': parameter '{}' (whole shape [{}]) was split along dimension {} "
            "when saved and is split along {} here; allowed: the same dimension",
            origin_, p.name, fmt::join(whole, ", "), saved_dim, dim);
      }
      Cut cut;
      cut.group = g;
      cut.index = i;
      const int along = dim >= 0 ? dim : saved_dim;
      cut.whole = along < 0;
      if (!cut.whole) {
        const auto d = static_cast<size_t>(along);
        const int64_t rows = whole[d];
        if (dim >= 0 && rows % size != 0) {
          fail(
              "checkpoint '{}': parameter '{}' has {} rows along dimension {}, which {} "
              "tensor-parallel ranks cannot split evenly",
              origin_, p.name, rows, dim, size);
        }
        for (size_t k = 0; k < d; ++k) cut.outer *= whole[k];
        for (size_t k = d + 1; k < whole.size(); ++k) cut.inner *= whole[k];
        cut.saved_rows = saved_dim >= 0 ? rows / saved_size : rows;
        cut.rows = dim >= 0 ? rows / size : rows;
        cut.first = dim >= 0 ? cut.rows * coordinate : 0;
        whole[d] = cut.rows;
      }
      p.shape = whole;
      p.numel = 1;
      for (int64_t n : whole) p.numel *= n;
      p.tensor_parallel_dim = dim;
      cuts_.emplace(p.name, cut);
    }
  }
}

const ReslicedCheckpoint::Cut& ReslicedCheckpoint::cut(const std::string& name) const {
  const auto it = cuts_.find(name);
  if (it == cuts_.end()) {
    fail("checkpoint '{}' has no parameter '{}' (the model has it): a different model?", origin_,
         name);
  }
  return it->second;
}

const SavedParam& ReslicedCheckpoint::param(const std::string& name, size_t* group) const {
  const Cut& c = cut(name);
  if (group != nullptr) *group = c.group;
  return manifest_.groups[c.group].params[c.index];
}

// Element i of this rank's tensor is (o, row, k) in [outer, rows, inner]; its row in the
// whole parameter is first + row, held by part (first + row) / saved_rows. A run of
// elements stays in one part while the rows do.
void ReslicedCheckpoint::read(const std::string& name, int array, int64_t begin, int64_t count,
                              float* out) const {
  const Cut& c = cut(name);
  if (c.whole) {
    parts_[0]->read(name, array, begin, count, out);
    return;
  }
  const int64_t block = c.rows * c.inner;  // one outer index's elements here
  for (int64_t i = begin; i < begin + count;) {
    const int64_t o = i / block, row = (i % block) / c.inner, k = i % c.inner;
    const int64_t whole_row = c.first + row;
    const int64_t part = whole_row / c.saved_rows, saved_row = whole_row % c.saved_rows;
    const int64_t rows_here = std::min(c.saved_rows - saved_row, c.rows - row);
    const int64_t run = std::min(rows_here * c.inner - k, begin + count - i);
    const int64_t at = (o * c.saved_rows + saved_row) * c.inner + k;
    parts_[static_cast<size_t>(part)]->read(name, array, at, run, out + (i - begin));
    i += run;
  }
}

void ReslicedCheckpoint::read_buffer(const SavedBuffer& buffer, void* out) const {
  parts_[0]->read_buffer(buffer, out);
}

}  // namespace zeroshard
