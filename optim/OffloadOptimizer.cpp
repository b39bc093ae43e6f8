#include "optim/OffloadOptimizer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <ATen/ATen.h>

#include "common/Error.h"
#include "common/FaultPoint.h"
#include "offload/CpuAdam.h"
#include "offload/IoEngine.h"
#include "offload/PinnedPool.h"
#include "offload/Swapper.h"

namespace zeroshard {
namespace {

// A region holds master, m and v of n elements back to back.
int64_t region_bytes(int64_t n) {
  return 12 * n;
}

}  // namespace

OffloadOptimizer::OffloadOptimizer(const OffloadOptimizerOptions& options, MemoryLedger* ledger)
    : options_(options), ledger_(ledger) {
  if (options_.device != OffloadDevice::Cpu && options_.device != OffloadDevice::Nvme) {
    fail("offload_optimizer.device: '{}' is not an offload device; allowed: cpu, nvme",
         offload_device_name(options_.device));
  }
  if (options_.sub_group_numel < 1) {
    fail("zero_optimization.sub_group_size: {} is not allowed; use >= 1", options_.sub_group_numel);
  }
}

OffloadOptimizer::~OffloadOptimizer() = default;

void OffloadOptimizer::add_group(const at::Tensor& shard, std::vector<HyperSpan> spans) {
  if (nvme_.swapper) fail("OffloadOptimizer: add_group after the first step");
  const size_t group = shards_.size();
  shards_.push_back(shard);
  spans_.push_back(std::move(spans));
  if (!shard.device().is_cpu() && !uploads_)
    uploads_ = std::make_unique<ShardUploads>(shard.device(), ledger_);
  const int64_t n = shard.numel();
  if (options_.device == OffloadDevice::Cpu) {
    const auto host = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
    host_.push_back({shard.to(host, /*non_blocking=*/false, /*copy=*/true), at::zeros({n}, host),
                     at::zeros({n}, host)});
    entries_.emplace_back(ledger_, Tier::Host, Kind::MasterParams, n * 4);
    entries_.emplace_back(ledger_, Tier::Host, Kind::OptimizerStates, n * 8);
    return;
  }
  for (int64_t off = 0; off < n; off += options_.sub_group_numel) {
    nvme_.sub_groups.push_back({group, off, std::min(options_.sub_group_numel, n - off)});
  }
}

void OffloadOptimizer::start() {
  if (uploads_ && uploads_->slot_bytes() == 0) uploads_->reserve(largest_part_bytes());
  if (options_.device == OffloadDevice::Nvme && !nvme_.swapper) open_swap();
}

void OffloadOptimizer::open_swap() {
  std::vector<int64_t> bytes;
  int64_t largest = 0;
  for (const auto& s : nvme_.sub_groups) {
    bytes.push_back(region_bytes(s.numel));
    largest = std::max(largest, s.numel);
  }
  const int64_t slots = std::max<int64_t>(1, options_.buffer_count);
  nvme_.pool =
      std::make_unique<PinnedPool>(slots, region_bytes(largest), ledger_, options_.page_lock);
  options_.io->register_buffers(nvme_.pool->all());
  // The swap regions hold master and m+v: counted under those two kinds.
  nvme_.swapper = std::make_unique<Swapper>(options_.io, options_.swap_dir, "optimizer", bytes,
                                            nullptr, Kind::OptimizerStates);
  int64_t total = 0;
  for (const auto& s : nvme_.sub_groups) total += s.numel;
  entries_.emplace_back(ledger_, Tier::Nvme, Kind::MasterParams, total * 4);
  entries_.emplace_back(ledger_, Tier::Nvme, Kind::OptimizerStates, total * 8);
  // First state: master = the parameters, m = v = 0, written through the same pipeline.
  nvme_.swapper->update_each(
      all_sub_groups(), *nvme_.pool,
      [&](size_t r, void* buffer) {
        const SubGroup& s = nvme_.sub_groups[r];
        auto* f = static_cast<float*>(buffer);
        at::Tensor master = at::from_blob(f, {s.numel}, at::kFloat);
        master.copy_(shards_[s.group].narrow(0, s.offset, s.numel));
        std::memset(f + s.numel, 0, static_cast<size_t>(8 * s.numel));
      },
      Swapper::Pass::Fill);
}

uint16_t* OffloadOptimizer::fused_bf16(size_t group, int64_t first, const at::Tensor& staging) {
  const at::Tensor& shard = shards_[group];
  if (shard.scalar_type() != at::kBFloat16) return nullptr;
  if (staging.defined()) return reinterpret_cast<uint16_t*>(staging.data_ptr<at::BFloat16>());
  if (!shard.is_contiguous()) return nullptr;
  return reinterpret_cast<uint16_t*>(shard.data_ptr<at::BFloat16>()) + first;
}

int64_t OffloadOptimizer::largest_part_bytes() const {
  int64_t largest = 0;
  for (const at::Tensor& shard : shards_) {
    const int64_t part = options_.device == OffloadDevice::Nvme
                             ? std::min(options_.sub_group_numel, shard.numel())
                             : shard.numel();
    largest = std::max(largest, part * static_cast<int64_t>(shard.element_size()));
  }
  return largest;
}

at::Tensor OffloadOptimizer::upload_staging(size_t group, int64_t count) {
  const at::Tensor& shard = shards_[group];
  if (shard.device().is_cpu()) return at::Tensor();
  if (uploads_->slot_bytes() == 0) uploads_->reserve(largest_part_bytes());  // start() not called
  return uploads_->staging(shard.scalar_type(), count);
}

void OffloadOptimizer::write_back(size_t group, int64_t first, int64_t count, const float* master,
                                  const uint16_t* bf16, const at::Tensor& staging) {
  at::Tensor dst = shards_[group].narrow(0, first, count);
  const at::Tensor updated = at::from_blob(const_cast<float*>(master), {count}, at::kFloat);
  if (!staging.defined()) {
    if (bf16 == nullptr) dst.copy_(updated);  // else CPU Adam wrote the shard in place
    return;
  }
  if (bf16 == nullptr) staging.copy_(updated);  // compute precision, on the host
  uploads_->upload(dst, staging);
}

void OffloadOptimizer::wait_uploads() {
  if (uploads_) uploads_->wait_all();
}

void OffloadOptimizer::order_uploads_before_current() {
  if (uploads_) uploads_->order_before_current();
}

void OffloadOptimizer::adam(size_t group, const Update& u, int64_t first, int64_t count,
                            float* master, float* m, float* v) {
  const at::Tensor staging = upload_staging(group, count);
  uint16_t* bf16 = fused_bf16(group, first, staging);
  for_each_span(spans_[group], *u.hypers, first, count,
                [&](int64_t begin, int64_t n, const AdamHyper& h) {
                  const int64_t at = begin - first;
                  cpu_adam_step(CpuAdamStep{h, steps_, u.grad_scale}, master + at, u.grad + begin,
                                m + at, v + at, n, bf16 == nullptr ? nullptr : bf16 + at,
                                options_.sum_grad_squares ? &grad_squares_.at(group) : nullptr);
                });
  write_back(group, first, count, master, bf16, staging);
}

void OffloadOptimizer::adam_sub_group(size_t r, const Update& u, void* buffer) {
  const SubGroup& sg = nvme_.sub_groups[r];
  fault_point("step.nvme_sub_group");
  if (sg.offset == 0 && hooks_.begin) hooks_.begin(sg.group);
  auto* f = static_cast<float*>(buffer);
  adam(sg.group, u, sg.offset, sg.numel, f, f + sg.numel, f + 2 * sg.numel);
  const bool last = sg.offset + sg.numel == shards_[sg.group].numel();
  if (last && hooks_.end) {
    wait_uploads();  // what the hook does with the shard reads the updated values
    hooks_.end(sg.group);
  }
}

double OffloadOptimizer::grad_sum_squares() const {
  double sum = 0;
  for (const double x : grad_squares_) sum += x;
  return sum;
}

SwapPassTimes OffloadOptimizer::last_swap_pass() const {
  return nvme_.swapper ? nvme_.swapper->last_pass() : SwapPassTimes{};
}

void OffloadOptimizer::io_pass() {
  if (options_.device != OffloadDevice::Nvme)
    fail("OffloadOptimizer::io_pass: the optimizer state is in host RAM, not on NVMe");
  if (!nvme_.swapper) open_swap();
  nvme_.swapper->update_each(all_sub_groups(), *nvme_.pool, [](size_t, void*) {});
}

void OffloadOptimizer::step(const std::vector<at::Tensor>& grads, double grad_scale,
                            const std::vector<AdamHyper>& hypers) {
  if (grads.size() != shards_.size())
    fail("OffloadOptimizer: {} gradients for {} groups", grads.size(), shards_.size());
  begin_step();
  if (options_.device == OffloadDevice::Cpu) {
    for (size_t i = 0; i < shards_.size(); ++i) step_group(i, grads[i], grad_scale, hypers);
    return order_uploads_before_current();
  }
  // NVMe: one pipeline over every sub-group of every group, reads running ahead.
  std::vector<at::Tensor> host_grads;
  for (const auto& g : grads) host_grads.push_back(g.to(at::kCPU, at::kFloat).contiguous());
  if (!nvme_.swapper) open_swap();
  nvme_.swapper->update_each(all_sub_groups(), *nvme_.pool, [&](size_t r, void* buffer) {
    const Update u{host_grads[nvme_.sub_groups[r].group].data_ptr<float>(), grad_scale, &hypers};
    adam_sub_group(r, u, buffer);
  });
  order_uploads_before_current();
}

void OffloadOptimizer::step_group(size_t group, const at::Tensor& grad, double grad_scale,
                                  const std::vector<AdamHyper>& hypers) {
  const at::Tensor host_grad = grad.to(at::kCPU, at::kFloat).contiguous();
  const Update u{host_grad.data_ptr<float>(), grad_scale, &hypers};
  if (options_.device == OffloadDevice::Cpu) {
    fault_point("step.cpu_group");
    if (hooks_.begin) hooks_.begin(group);
    HostState& h = host_[group];
    adam(group, u, 0, h.master.numel(), h.master.data_ptr<float>(), h.m.data_ptr<float>(),
         h.v.data_ptr<float>());
    if (hooks_.end) {
      wait_uploads();
      hooks_.end(group);
    }
    return;
  }
  if (!nvme_.swapper) open_swap();
  nvme_.swapper->update_each(sub_groups_of(group), *nvme_.pool,
                             [&](size_t r, void* buffer) { adam_sub_group(r, u, buffer); });
}

void OffloadOptimizer::reload_master(size_t group) {
  const at::Tensor& shard = shards_.at(group);
  if (options_.device == OffloadDevice::Cpu) {
    host_[group].master.copy_(shard);
    return;
  }
  if (!nvme_.swapper) open_swap();
  nvme_.swapper->update_each(sub_groups_of(group), *nvme_.pool, [&](size_t r, void* buffer) {
    const SubGroup& s = nvme_.sub_groups[r];
    at::from_blob(buffer, {s.numel}, at::kFloat).copy_(shard.narrow(0, s.offset, s.numel));
  });
}

std::vector<size_t> OffloadOptimizer::all_sub_groups() const {
  std::vector<size_t> order(nvme_.sub_groups.size());
  std::iota(order.begin(), order.end(), size_t{0});
  return order;
}

std::vector<size_t> OffloadOptimizer::sub_groups_of(size_t group) const {
  std::vector<size_t> order;
  for (size_t r = 0; r < nvme_.sub_groups.size(); ++r)
    if (nvme_.sub_groups[r].group == group) order.push_back(r);
  return order;
}

void OffloadOptimizer::read_state(size_t group, float* master, float* m, float* v) {
  const int64_t n = shards_.at(group).numel();
  if (options_.device == OffloadDevice::Cpu) {
    const HostState& h = host_[group];
    std::memcpy(master, h.master.data_ptr<float>(), n * 4);
    std::memcpy(m, h.m.data_ptr<float>(), n * 4);
    std::memcpy(v, h.v.data_ptr<float>(), n * 4);
    return;
  }
  if (!nvme_.swapper) open_swap();
  // Streamed one sub-group at a time through the pinned buffers.
  nvme_.swapper->update_each(
      sub_groups_of(group), *nvme_.pool,
      [&](size_t r, void* buffer) {
        const SubGroup& s = nvme_.sub_groups[r];
        const auto* f = static_cast<const float*>(buffer);
        std::memcpy(master + s.offset, f, s.numel * 4);
        std::memcpy(m + s.offset, f + s.numel, s.numel * 4);
        std::memcpy(v + s.offset, f + 2 * s.numel, s.numel * 4);
      },
      Swapper::Pass::Drain);
}

void OffloadOptimizer::write_state(size_t group, const float* master, const float* m,
                                   const float* v) {
  at::Tensor& shard = shards_.at(group);
  const int64_t n = shard.numel();
  if (options_.device == OffloadDevice::Cpu) {
    HostState& h = host_[group];
    std::memcpy(h.master.data_ptr<float>(), master, n * 4);
    std::memcpy(h.m.data_ptr<float>(), m, n * 4);
    std::memcpy(h.v.data_ptr<float>(), v, n * 4);
  } else {
    if (!nvme_.swapper) open_swap();
    nvme_.swapper->update_each(
        sub_groups_of(group), *nvme_.pool,
        [&](size_t r, void* buffer) {
          const SubGroup& s = nvme_.sub_groups[r];
          auto* f = static_cast<float*>(buffer);
          std::memcpy(f, master + s.offset, s.numel * 4);
          std::memcpy(f + s.numel, m + s.offset, s.numel * 4);
          std::memcpy(f + 2 * s.numel, v + s.offset, s.numel * 4);
        },
        Swapper::Pass::Fill);
  }
  shard.copy_(host_floats(master, n));
}

void OffloadOptimizer::read_state(size_t group, const std::vector<float*>& arrays) {
  if (arrays.size() != 3)
    fail("OffloadOptimizer::read_state: {} arrays; Adam keeps 3", arrays.size());
  read_state(group, arrays[0], arrays[1], arrays[2]);
}

void OffloadOptimizer::write_state(size_t group, const std::vector<std::string>& names,
                                   const std::vector<const float*>& arrays) {
  check_state_names(names, adam_state_names(), "zeroshard's Adam/AdamW");
  if (arrays.size() != 3)
    fail("OffloadOptimizer::write_state: {} arrays; Adam keeps 3", arrays.size());
  write_state(group, arrays[0], arrays[1], arrays[2]);
}

}  // namespace zeroshard
