#pragma once
// The random streams a checkpoint keeps for each rank: the CPU generator's state, then,
// when the engine trains on an accelerator, that device's default generator's (on a GPU,
// its Philox seed and offset: what dropout draws from). Restored only where they mean
// the same thing: the device's stream goes back to a device of the same type.
#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace zeroshard {

struct RngStates {
  std::string bytes;         // the CPU state, then the device's
  int64_t device_bytes = 0;  // the device's part at the end (0: none saved)
};

// Bytes the states of `device` take (what a manifest records before they are written).
RngStates rng_states_of(const c10::Device& device);

// Sets the CPU generator, and the device's where one was saved and `device` is an
// accelerator; a device stream saved on a GPU is left out when training on the CPU.
void restore_rng_states(const RngStates& saved, const c10::Device& device);

}  // namespace zeroshard
