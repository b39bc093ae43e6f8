#pragma once
// A checkpoint saved at one tensor-parallel size, read at another (engine/Checkpoint.h has
// the layout: one part per saved tp coordinate). Each split parameter is its saved slices
// put end to end along the dimension they were cut on, then cut again for this rank's tp
// coordinate; a parameter held whole is read from the first part (every tp rank saved
// the same values). Nothing is assembled in memory: each read is mapped to the ranges of
// the parts that hold it.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/Checkpoint.h"
#include "engine/CheckpointReader.h"

namespace zeroshard {

class ReslicedCheckpoint : public CheckpointSource {
 public:
  // `parts`: the saved tp coordinates' checkpoints in order (one when saved without tensor
  // parallelism). `size`, `coordinate`: this engine's tp size and this rank's coordinate;
  // `split_dims`: the dimension this engine splits each parameter along (absent: whole).
  // DIR/TAG is the checkpoint, as errors name it.
  ReslicedCheckpoint(std::vector<std::unique_ptr<CheckpointReader>> parts, int size, int coordinate,
                     const std::unordered_map<std::string, int>& split_dims, const std::string& dir,
                     const std::string& tag);

  // The first part's, tagged TAG, with each parameter's shape as this rank holds it.
  const Manifest& manifest() const override { return manifest_; }
  const SavedParam& param(const std::string& name, size_t* group = nullptr) const override;
  bool has_param(const std::string& name) const override { return cuts_.count(name) != 0; }
  void read(const std::string& name, int array, int64_t begin, int64_t count,
            float* out) const override;
  void read_buffer(const SavedBuffer& buffer, void* out) const override;

 private:
  // How this rank's tensor maps onto the saved slices: seen as [outer, rows, inner] along
  // the cut dimension, this rank's rows [first, first + rows) of the whole parameter's,
  // each part holding `saved_rows` of them in order.
  struct Cut {
    size_t group = 0, index = 0;  // in manifest_
    bool whole = true;            // neither side splits it: read as it is
    int64_t outer = 1, inner = 1, rows = 0, saved_rows = 0, first = 0;
  };
  const Cut& cut(const std::string& name) const;  // fails naming a parameter it lacks

  std::vector<std::unique_ptr<CheckpointReader>> parts_;
  Manifest manifest_;
  std::unordered_map<std::string, Cut> cuts_;
  std::string origin_;
};

}  // namespace zeroshard
