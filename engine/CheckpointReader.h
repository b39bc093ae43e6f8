#pragma once
// Reading a sharded checkpoint (the format: engine/Checkpoint.h): saved parameters by
// name, element ranges of them gathered from the rank files, joined from their parts where
// they were saved in parts.
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/Checkpoint.h"

namespace zeroshard {

// What a load reads: saved parameters by name, as this engine's ranks hold them, and the
// buffers. One checkpoint's files (CheckpointReader), or the parts of one saved at another
// tensor-parallel size re-cut for this rank (engine/ReslicedCheckpoint.h).
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  virtual const Manifest& manifest() const = 0;
  // The saved parameter `name`: its group and entry, or an Error naming it.
  virtual const SavedParam& param(const std::string& name, size_t* group = nullptr) const = 0;
  virtual bool has_param(const std::string& name) const = 0;
  // Elements [begin, begin+count) of parameter `name`, from array `array` (0 master,
  // then the optimizer's state arrays in Manifest::optimizer_state's order for trainable
  // groups; 0 the parameters for frozen ones), as fp32.
  virtual void read(const std::string& name, int array, int64_t begin, int64_t count,
                    float* out) const = 0;
  // A saved buffer's bytes (rank0.bin), into a host uint8 tensor.
  virtual void read_buffer(const SavedBuffer& buffer, void* out) const = 0;
  // Whether it holds other pipeline stages' parameters and buffers too (a checkpoint of
  // another split): those are no strict load's surprise then.
  virtual bool holds_other_stages() const { return false; }
};

// Element ranges of saved parameters, gathered from the rank files by name (the parts of
// one saved in parts joined).
class CheckpointReader : public CheckpointSource {
 public:
  CheckpointReader(const std::string& dir, Manifest manifest);
  ~CheckpointReader() override;
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;
  const Manifest& manifest() const override { return manifest_; }
  const SavedParam& param(const std::string& name, size_t* group = nullptr) const override;
  bool has_param(const std::string& name) const override {
    return index_.count(name) != 0 || parts_.count(name) != 0;
  }
  void read(const std::string& name, int array, int64_t begin, int64_t count,
            float* out) const override;
  std::string read_rng(int rank) const;
  void read_buffer(const SavedBuffer& buffer, void* out) const override;

 private:
  using Where = std::pair<size_t, size_t>;  // group, param
  void read_saved(Where where, const std::string& name, int array, int64_t begin, int64_t count,
                  float* out) const;

  std::string dir_;
  Manifest manifest_;
  std::vector<int> fds_;
  std::unordered_map<std::string, Where> index_;
  // Parameters saved in parts: the whole as a SavedParam (its shape), and the parts in
  // the order of their whole_offset, which cover it end to end.
  struct Parts {
    SavedParam whole;
    std::vector<Where> parts;
  };
  std::unordered_map<std::string, Parts> parts_;
};

}  // namespace zeroshard
