#pragma once
// Every difference between the LibTorch versions zeroshard supports lives here: 2.6
// (Debian trixie's, the oldest) to 2.11 (PyPI's, the GPU machines'). Only
// torch/version.h is included so this header stays cheap.
#include <torch/version.h>

#define ZS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(ZS_TORCH_AT_LEAST(2, 6), "zeroshard needs LibTorch 2.6 or newer");

namespace zeroshard::compat {

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// TCPStore uses libuv by default, and Debian's LibTorch is built without it ("use_libuv
// was requested but PyTorch was build without libuv support"). The plain TCP store
// works on every build, so every build uses it: one store implementation to test.
template <typename TcpStoreOptions>
void use_plain_tcp_store(TcpStoreOptions& options) {
  options.useLibUV = false;
}

}  // namespace zeroshard::compat
