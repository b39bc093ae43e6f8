#pragma once
// A checkpoint of pipeline stages read by an engine of another split (another number of
// stages, or other layers in this stage): every saved stage's part seen as one checkpoint,
// each parameter, its optimizer state and each buffer read from the part that holds it.
// The stages' modules must name their parameters apart (DeepSpeed's PipelineModule numbers
// its layers across the whole model); a name two parts both hold is refused. Steps,
// optimizer settings and the client state are the first part's (every stage saved the same).
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/Checkpoint.h"
#include "engine/CheckpointReader.h"

namespace zeroshard {

class StagesCheckpoint : public CheckpointSource {
 public:
  // `parts`: the saved stages' checkpoints in stage order. DIR/TAG names it in errors.
  StagesCheckpoint(std::vector<std::unique_ptr<CheckpointSource>> parts, const std::string& dir,
                   const std::string& tag);

  // The first part's, tagged TAG, with every part's groups and buffers.
  const Manifest& manifest() const override { return manifest_; }
  const SavedParam& param(const std::string& name, size_t* group = nullptr) const override;
  bool has_param(const std::string& name) const override { return holder_.count(name) != 0; }
  void read(const std::string& name, int array, int64_t begin, int64_t count,
            float* out) const override;
  void read_buffer(const SavedBuffer& buffer, void* out) const override;
  bool holds_other_stages() const override { return true; }

 private:
  size_t part_of(const std::string& name) const;  // fails naming a parameter it lacks

  std::vector<std::unique_ptr<CheckpointSource>> parts_;
  std::vector<size_t> first_group_;                  // each part's groups in manifest_
  std::unordered_map<std::string, size_t> holder_;   // parameter -> part
  std::unordered_map<std::string, size_t> buffers_;  // buffer -> part
  Manifest manifest_;
  std::string origin_;
};

}  // namespace zeroshard
