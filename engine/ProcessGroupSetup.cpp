#include "engine/ProcessGroupSetup.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/ranges.h>

#include "common/Error.h"
#include "common/Logging.h"
#include "common/TorchCompat.h"
#include "engine/NcclGroup.h"

namespace zeroshard {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// This host's address on the route to `master_addr` (the source address the kernel
// would pick for it), or "" where that cannot be found. A UDP connect sends nothing.
std::string local_address_towards(const std::string& master_addr, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master_addr.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return "";
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage self{};
    socklen_t len = sizeof(self);
    char host[NI_MAXHOST];
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&self), len, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST) == 0)
      local = host;
    close(fd);
  }
  freeaddrinfo(found);
  return local;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr, int port) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // All ranks on this machine: bind where the rendezvous is, not to whatever the
  // host name resolves to.
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  // Across hosts: the address peers reach this host by is the one on the route to the
  // rendezvous; the host name may resolve to an address on no shared network (a
  // container's, a loopback alias), where peers would never connect.
  const std::string local = local_address_towards(master_addr, port);
  if (!local.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(local);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// A socket listening on exactly the rendezvous address (not every interface), for the
// store server to take over.
int listen_on(const LaunchEnv& env) {
  const std::string& addr = env.master_addr;
  const int port = env.master_port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &found); rc != 0) {
    fail("MASTER_ADDR: cannot resolve '{}': {}", addr, ::gai_strerror(rc));
  }
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0 && error == EADDRNOTAVAIL) {
    fail(
        "rendezvous: rank 0 cannot listen on {}:{}: {} is not an address of rank 0's host; "
        "the address came from {}: run rank 0 there or set MASTER_ADDR to rank 0's host",
        addr, port, addr, env.master_origin);
  }
  if (fd < 0) {
    fail("rendezvous: cannot listen on {}:{}: {} (is another job using MASTER_PORT {}?)", addr,
         port, std::strerror(error), port);
  }
  return fd;
}

using GroupMaker = std::function<c10::intrusive_ptr<c10d::Backend>(
    const std::string& prefix, int rank, int size, bool high_priority)>;

// Every rank makes its groups in one order (the world's or its data-parallel group's, its
// tp group, its pp group, its hpZ group, its edp group, then its shard and replica groups), and
// each group's store prefix names its members, so no two groups wait on each other while they
// connect.
void make_groups(DistContext& ctx, const GroupMaker& make_group) {
  const ParallelDims& d = ctx.dims;
  if (d.size(Dim::Dp) == d.world()) {
    const int world = d.world(), rank = d.rank();
    ctx.set_group(std::nullopt, GroupStream::Main, make_group("main", rank, world, false));
    // Gathers: compute waits on them.
    ctx.set_group(std::nullopt, GroupStream::Params, make_group("params", rank, world, true));
    ctx.set_group(std::nullopt, GroupStream::Touch, make_group("touch", rank, world, false));
  } else {
    const std::string dp = d.group_name(Dim::Dp);
    const int in_dp = d.coordinate(Dim::Dp), size = d.size(Dim::Dp);
    if (size > 1) {
      ctx.set_group(Dim::Dp, GroupStream::Main, make_group(dp, in_dp, size, false));
      ctx.set_group(Dim::Dp, GroupStream::Params, make_group(dp + "/params", in_dp, size, true));
      ctx.set_group(Dim::Dp, GroupStream::Touch, make_group(dp + "/touch", in_dp, size, false));
    }
    for (const Dim dim : {Dim::Tp, Dim::Pp}) {
      if (d.size(dim) == 1) continue;
      ctx.set_group(dim, GroupStream::Main,
                    make_group(d.group_name(dim), d.coordinate(dim), d.size(dim), false));
    }
  }
  if (d.splits(Dim::Hpz)) {
    ctx.set_group(Dim::Hpz, GroupStream::Params,
                  make_group(d.group_name(Dim::Hpz) + "/params", d.coordinate(Dim::Hpz),
                             d.size(Dim::Hpz), true));
  }
  if (d.size(Dim::Ep) > 1 && d.size(Dim::Edp) > 1) {
    const std::string edp = d.group_name(Dim::Edp);
    const int in_edp = d.coordinate(Dim::Edp), size = d.size(Dim::Edp);
    ctx.set_group(Dim::Edp, GroupStream::Main, make_group(edp, in_edp, size, false));
    ctx.set_group(Dim::Edp, GroupStream::Params, make_group(edp + "/params", in_edp, size, true));
    ctx.set_group(Dim::Edp, GroupStream::Touch, make_group(edp + "/touch", in_edp, size, false));
  }
  if (d.size(Dim::DpShard) == d.size(Dim::Dp)) return;
  if (d.splits(Dim::DpShard)) {
    const std::string shard = d.group_name(Dim::DpShard);
    const int in_shard = d.coordinate(Dim::DpShard), size = d.size(Dim::DpShard);
    ctx.set_group(Dim::DpShard, GroupStream::Main, make_group(shard, in_shard, size, false));
    ctx.set_group(Dim::DpShard, GroupStream::Params,
                  make_group(shard + "/params", in_shard, size, true));
    ctx.set_group(Dim::DpShard, GroupStream::Touch,
                  make_group(shard + "/touch", in_shard, size, false));
  }
  // Shard groups of one rank still have replicas: every rank holds the same whole state.
  ctx.set_group(Dim::DpReplicate, GroupStream::Main,
                make_group(d.group_name(Dim::DpReplicate), d.coordinate(Dim::DpReplicate),
                           d.size(Dim::DpReplicate), false));
}

// ZS_DIST_BACKEND picks the c10d backend for CUDA tensors: nccl (the default) or gloo
// (slower, but several ranks may share one GPU, which NCCL refuses). Host tensors always
// go through Gloo.
std::string backend_for(const c10::Device& device) {
  const char* chosen = std::getenv("ZS_DIST_BACKEND");
  const std::string backend = chosen ? chosen : (device.is_cuda() ? "nccl" : "gloo");
  if (backend != "nccl" && backend != "gloo") {
    fail("environment variable ZS_DIST_BACKEND is '{}'; allowed: nccl or gloo (or unset)", backend);
  }
  if (backend == "nccl" && !device.is_cuda()) {
    fail(
        "environment variable ZS_DIST_BACKEND is 'nccl' but the model is on {}; allowed: gloo "
        "or unset (NCCL carries CUDA tensors only)",
        device.str());
  }
  return backend;
}

// The rendezvous store, under this engine's own prefix: a store served by someone else
// (torchrun's agent, torch.distributed's) outlives engines, and keys of an earlier engine
// would be read as this one's. Every rank builds its engines in the same order, so the
// numbers agree. A lone rank keeps its store in the process: it serves nobody, and a
// port would clash with the next one-GPU job on the machine.
// The store rank 0 serves is kept for the process too, for the engines after this one: a
// rank done with an engine may build the next one's groups before rank 0 has let go of
// its first engine, and would find the first engine's store gone under it.
std::set<std::pair<std::string, int>>& engine_served_rendezvous() {
  static std::set<std::pair<std::string, int>> where;
  return where;
}

c10::intrusive_ptr<c10d::Store> make_store(const LaunchEnv& env,
                                           std::chrono::milliseconds timeout) {
  static std::atomic<int> engines_made{0};
  static std::mutex served_mutex;
  static std::map<std::pair<std::string, int>, c10::intrusive_ptr<c10d::Store>> served;
  const std::string prefix = fmt::format("zs/{}", engines_made++);
  if (env.world_size == 1) {
    return c10::make_intrusive<c10d::PrefixStore>(prefix, c10::make_intrusive<c10d::HashStore>());
  }
  const bool serves = env.rank == 0 && !env.agent_store;
  const std::pair<std::string, int> where{env.master_addr, env.master_port};
  std::lock_guard<std::mutex> lock(served_mutex);
  if (!env.agent_store) engine_served_rendezvous().insert(where);
  if (serves && served.count(where) > 0) {
    served.at(where)->setTimeout(timeout);
    return c10::make_intrusive<c10d::PrefixStore>(prefix, served.at(where));
  }
  // A write to a peer that died must fail as an error this rank can report, not kill it
  // with SIGPIPE (seen on LibTorch 2.6: rank 0 died of it while naming the lost rank).
  std::signal(SIGPIPE, SIG_IGN);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = serves;
  opts.numWorkers = env.world_size;
  opts.waitWorkers = true;
  opts.timeout = timeout;
  compat::use_plain_tcp_store(opts);
  if (opts.isServer) opts.masterListenFd = listen_on(env);
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  if (serves) served.emplace(where, store);
  return c10::make_intrusive<c10d::PrefixStore>(prefix, store);
}

}  // namespace

bool engine_serves_rendezvous(const LaunchEnv& env) {
  return env.world_size > 1 && !env.agent_store &&
         engine_served_rendezvous().count({env.master_addr, env.master_port}) > 0;
}

DistContext init_distributed(const LaunchEnv& env, std::chrono::milliseconds timeout,
                             c10::Device device, int shard_size, int hpz_size,
                             const std::function<void(c10d::Store&)>& agree, int tp_size,
                             int pp_size, int ep_size) {
  DistContext ctx;
  ctx.env = env;
  ctx.timeout = timeout;
  ctx.dims =
      ParallelDims(env.world_size, env.rank, shard_size, hpz_size, tp_size, pp_size, ep_size);
  // One process on the host gets no group: every collective is a no-op. On a GPU it gets
  // groups of one, so a one-GPU run takes the path (NCCL, streams) many GPUs take.
  const std::string backend = backend_for(device);
  if (env.world_size == 1 && !device.is_cuda()) return ctx;
  try {
    ctx.store = make_store(env, timeout);
    if (agree) agree(*ctx.store);
    GroupMaker make_group;
    if (backend == "nccl") {
      const int index = device.has_index() ? device.index() : env.local_rank;
      // index by value: make_groups runs after this block, where a reference would dangle
      make_group = [&ctx, index, timeout](const std::string& prefix, int rank, int size,
                                          bool high_priority) {
        auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, ctx.store);
        return make_nccl_group(store, rank, size, index, timeout, high_priority);
      };
    } else {
      auto gloo_opts = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_opts->devices.push_back(gloo_device(env.master_addr, env.master_port));
      make_group = [&, gloo_opts](const std::string& prefix, int rank, int size, bool) {
        auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, ctx.store);
        return c10::intrusive_ptr<c10d::Backend>(
            c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_opts));
      };
    }
    make_groups(ctx, make_group);
  } catch (const Error&) {
    throw;  // already says what to do
  } catch (const std::exception& e) {
    fail("rank {}: rendezvous at {}:{} with {} ranks failed ({}): {}", env.rank, env.master_addr,
         env.master_port, env.world_size, env.launcher, e.what());
  }
  return ctx;
}

c10::intrusive_ptr<c10d::Backend> DistContext::world(GroupStream stream) const {
  const auto it = groups_.find({std::nullopt, stream});
  return it == groups_.end() ? nullptr : it->second;
}

c10::intrusive_ptr<c10d::Backend> DistContext::data_parallel(GroupStream stream) const {
  return dims.size(Dim::Dp) < dims.world() ? group(Dim::Dp, stream) : world(stream);
}

c10::intrusive_ptr<c10d::Backend> DistContext::group(Dim dim, GroupStream stream) const {
  const auto it = groups_.find({dim, stream});
  return it == groups_.end() ? nullptr : it->second;
}

void DistContext::set_group(std::optional<Dim> dim, GroupStream stream,
                            c10::intrusive_ptr<c10d::Backend> backend) {
  groups_[{dim, stream}] = std::move(backend);
}

std::string DistContext::describe_missing_ranks() const {
  if (!store) return "";
  // Survivors notice a lost peer at different moments (a rank busy computing notices at
  // its next collective), so the roll-call waits a while for late ones: 5 s, or a third
  // of the timeout where that is shorter, so that survivors stop within the timeout.
  const auto kWindow = std::min<std::chrono::milliseconds>(std::chrono::seconds(5), timeout / 3);
  auto unanswered = [this](const std::string& what) {
    std::vector<int> missing;
    for (int r = 0; r < env.world_size; ++r) {
      if (!store->check({what + std::to_string(r)})) missing.push_back(r);
    }
    return missing;
  };
  std::vector<int> missing;
  try {
    store->set("alive/" + std::to_string(env.rank), std::vector<uint8_t>{1});
    const auto deadline = std::chrono::steady_clock::now() + kWindow;
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      missing = unanswered("alive/");
    } while (!missing.empty() && std::chrono::steady_clock::now() < deadline);
    store->set("done/" + std::to_string(env.rank), std::vector<uint8_t>{1});
    // The rank serving the store stays until every rank that answered has finished its
    // own roll-call (one that began later ends later), or for one more window.
    if (env.rank == 0 && !env.agent_store) {
      const auto last = std::chrono::steady_clock::now() + kWindow;
      while (unanswered("done/").size() > missing.size() && std::chrono::steady_clock::now() < last)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception&) {
    if (missing.empty()) return "rank 0, which hosts the rendezvous store, is gone";
    return fmt::format(
        "rank(s) {} did not respond, then rank 0, which hosts the rendezvous "
        "store, was gone",
        fmt::join(missing, ", "));
  }
  if (missing.empty()) return "every rank still answers";
  return fmt::format("rank(s) {} did not respond within {:.1f} s", fmt::join(missing, ", "),
                     kWindow.count() / 1000.0);
}

}  // namespace zeroshard
