#include "optim/ShardOptimizer.h"

#include <ATen/ATen.h>

namespace zeroshard {

at::Tensor host_floats(const float* data, int64_t n) {
  return at::from_blob(const_cast<float*>(data), {n}, at::kFloat);
}

at::Tensor fp32_master(const at::Tensor& shard, bool on_host) {
  const bool in_place = shard.scalar_type() == at::kFloat && (!on_host || shard.is_cpu());
  return in_place ? shard : shard.to(on_host ? at::kCPU : shard.device(), at::kFloat);
}

}  // namespace zeroshard
