#include "engine/RngStates.h"

#include <cstring>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

std::string state_bytes(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor state = gen.get_state();
  return std::string(static_cast<const char*>(state.data_ptr()),
                     static_cast<size_t>(state.numel()));
}

void set_state(at::Generator gen, const char* data, size_t size) {
  at::Tensor state = at::empty({static_cast<int64_t>(size)}, at::kByte);
  std::memcpy(state.data_ptr(), data, size);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngStates rng_states_of(const c10::Device& device) {
  RngStates out;
  out.bytes = state_bytes(at::detail::getDefaultCPUGenerator());
  if (!device.is_cpu()) {
    const std::string device_state = state_bytes(at::globalContext().defaultGenerator(device));
    out.bytes += device_state;
    out.device_bytes = static_cast<int64_t>(device_state.size());
  }
  return out;
}

void restore_rng_states(const RngStates& saved, const c10::Device& device) {
  if (saved.device_bytes < 0 || saved.device_bytes > static_cast<int64_t>(saved.bytes.size()))
    fail("checkpoint: device RNG state of {} bytes in {}", saved.device_bytes, saved.bytes.size());
  const size_t cpu = saved.bytes.size() - static_cast<size_t>(saved.device_bytes);
  if (cpu > 0) set_state(at::detail::getDefaultCPUGenerator(), saved.bytes.data(), cpu);
  if (saved.device_bytes > 0 && !device.is_cpu()) {
    set_state(at::globalContext().defaultGenerator(device), saved.bytes.data() + cpu,
              static_cast<size_t>(saved.device_bytes));
  }
}

}  // namespace zeroshard
