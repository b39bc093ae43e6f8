#pragma once
// The optimizer over this rank's shards, as the engine steps it: groups added once, a
// step over every group's reduced gradient, and each group's state read and written
// whole for checkpoints.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/AdamHyper.h"
#include "common/Error.h"

namespace zeroshard {

// Elements [begin, begin + count) of a group's shard hold elements [param_offset,
// param_offset + count) of parameter `param` (its index among the trainable parameters,
// the same on every rank; `shape` its shape). A parameter of the group that this rank's
// shard does not reach has a piece of count 0, so every rank sees every parameter.
struct ParamPiece {
  int64_t begin = 0;
  int64_t count = 0;
  size_t param = 0;
  int64_t param_offset = 0;
  std::vector<int64_t> shape;
  std::string name;
};

// A host array of n floats as a tensor (no copy): a checkpoint's array in read_state and
// write_state.
at::Tensor host_floats(const float* data, int64_t n);

// The fp32 weights an optimizer updates for `shard`: the shard itself where it is fp32
// and where the master lives (on the host with `on_host`), else an fp32 copy there.
at::Tensor fp32_master(const at::Tensor& shard, bool on_host);

// Adam's per-element state, as torch.optim.Adam names it: the built-in optimizers' names.
inline std::vector<std::string> adam_state_names() {
  return {"exp_avg", "exp_avg_sq"};
}

// The arrays a checkpoint hands write_state() are the ones `optimizer` (a name for the
// message) keeps: `names` equals `kept`.
inline void check_state_names(const std::vector<std::string>& names,
                              const std::vector<std::string>& kept, const char* optimizer) {
  if (names == kept) return;
  auto joined = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& n : v) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  fail(
      "the checkpoint holds optimizer state [{}], but this engine's optimizer ({}) keeps [{}]; "
      "resume with the optimizer the checkpoint was saved with",
      joined(names), optimizer, joined(kept));
}

// What the Engine steps: ResidentOptimizer (optim/ResidentOptimizer.h: state where the
// parameters are), engine/'s OffloadOptimizer (state in host RAM or on NVMe), or
// engine/'s ExternalOptimizer (a torch.optim class the Python package steps).
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  // `shard` is this rank's compute-precision parameter shard (a view it writes back to);
  // `spans`: which parameter group each of its elements belongs to (none: group 0).
  virtual void add_group(const at::Tensor& shard, std::vector<HyperSpan> spans = {}) = 0;
  // After add_group: which parameter each piece of the group's shard belongs to, for an
  // optimizer whose update needs whole-parameter quantities (Lamb's norms, Adafactor's
  // row and column statistics); `params`: how many trainable parameters there are so
  // far. The others ignore it.
  virtual void add_param_pieces(size_t group, std::vector<ParamPiece> pieces, size_t params) {
    (void)group, (void)pieces, (void)params;
  }
  // grads[i] (fp32, same size as group i) are multiplied by `grad_scale` first;
  // hypers[g] are parameter group g's hyperparameters.
  virtual void step(const std::vector<at::Tensor>& grads, double grad_scale,
                    const std::vector<AdamHyper>& hypers) = 0;
  // One parameter group.
  void step(const std::vector<at::Tensor>& grads, double grad_scale, const AdamHyper& h) {
    step(grads, grad_scale, std::vector<AdamHyper>{h});
  }
  virtual int64_t steps() const = 0;
  virtual size_t groups() const = 0;
  // The parameters of `group` were overwritten (outside training): the fp32 master
  // restarts from its shard; Adam's moments are kept.
  virtual void reload_master(size_t group) = 0;
  // Checkpoints, one whole group at a time (numel elements per array). The optimizer's
  // per-element state is fp32 arrays named as torch.optim names them (Adam: exp_avg,
  // exp_avg_sq), the same for every group and rank. `arrays`: the fp32 master first,
  // then one per name. write_state also sets the compute-precision shard from the
  // master, and refuses names it does not keep.
  virtual int64_t group_numel(size_t group) const = 0;
  virtual std::vector<std::string> state_names() const = 0;
  virtual void read_state(size_t group, const std::vector<float*>& arrays) = 0;
  virtual void write_state(size_t group, const std::vector<std::string>& names,
                           const std::vector<const float*>& arrays) = 0;
  // State that is not per element (torch's per-parameter step counts), as JSON; "null"
  // where the step count says it all.
  virtual std::string scalar_state() const { return "null"; }
  virtual void set_scalar_state(const std::string& json) { (void)json; }
  virtual void set_steps(int64_t steps) = 0;
  // After the last add_group, before the first step: what needs every group to be known
  // (the offloaded optimizer's NVMe layout and upload staging).
  virtual void start() {}
};

}  // namespace zeroshard
