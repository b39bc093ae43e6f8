#pragma once
// Every difference between LibTorch versions zeroshard meets lives here (1.13 on
// Debian bookworm, 2.x on trixie and on GPU machines). Only torch/version.h is
// included so this header stays cheap.
#include <torch/version.h>

#define ZS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace zeroshard::compat {

// The class the Gloo and NCCL process groups derive from, whose allreduce/allgather/
// alltoall_base zeroshard calls: ProcessGroup in 1.13, Backend from 2.0 on.
#if ZS_TORCH_AT_LEAST(2, 0)
using CommBackend = c10d::Backend;
#else
using CommBackend = c10d::ProcessGroup;
#endif

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// Gloo in LibTorch 1.13 refuses flat all-gather, every reduce-scatter, bf16
// all-reduce and AVG, and is unsafe to use after a refusal; so the collective path
// is chosen from these constants, never by trying. (Measured; see DESIGN.md.)
constexpr bool kGlooFlatAllGather = ZS_TORCH_AT_LEAST(2, 0);
constexpr bool kGlooFlatReduceScatter = ZS_TORCH_AT_LEAST(2, 0);
constexpr bool kGlooBf16AllReduce = ZS_TORCH_AT_LEAST(2, 0);
constexpr bool kGlooAvg = false;  // refused on 1.13 and on 2.6

// From 2.3 the TCPStore uses libuv by default, which Debian's LibTorch is built
// without ("use_libuv was requested but PyTorch was build without libuv support").
template <typename TcpStoreOptions>
void use_plain_tcp_store(TcpStoreOptions& options) {
#if ZS_TORCH_AT_LEAST(2, 3)
  options.useLibUV = false;
#else
  (void)options;
#endif
}

// From 2.4 the store server takes a listening socket zeroshard bound to the rendezvous
// address itself (masterListenFd); 1.13 listens on every interface and takes none.
constexpr bool kStoreTakesListenFd = ZS_TORCH_AT_LEAST(2, 4);
template <typename TcpStoreOptions>
void set_store_listen_fd(TcpStoreOptions& options, int fd) {
#if ZS_TORCH_AT_LEAST(2, 4)
  options.masterListenFd = fd;
#else
  (void)options;
  (void)fd;
#endif
}

}  // namespace zeroshard::compat
