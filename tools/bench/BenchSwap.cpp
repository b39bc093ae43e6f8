// zs bench swap: one optimizer step with fp32 master, m and v on NVMe (OffloadOptimizer:
// sub-groups read ahead, CpuAdam, written behind) beside, in the same run,
//   pure I/O:  the step's own regions read and written back unchanged through its own
//              pipeline, buffers and file, no Adam (OffloadOptimizer::io_pass);
//   pure Adam: the same step with the state in host RAM (optimizer offload to cpu).
// overlap_ratio = step time / max(pure I/O, pure Adam): 1.0 is perfect overlap, 2.0 none.
// The step's own phases (waiting for reads, Adam, last writes) say where a shortfall is.
// usage: zs-bench-swap [--json] [--dir DIR] [--params N] [--sub-group N] [--rounds N]
//                      [--threads N] [--queue-depth N] [--block-size BYTES]
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/Files.h"
#include "common/MemoryLedger.h"
#include "optim/OffloadOptimizer.h"
#include "offload/CpuAdam.h"
#include "offload/IoEngine.h"
#include "offload/SwapFile.h"
#include "offload/Swapper.h"
#include "tools/bench/BenchArgs.h"
#include "tools/bench/BestSeconds.h"

using namespace zeroshard;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  bool json = false;
  std::string dir = "build/bench-swap";
  int64_t params = 200'000'000;  // 2.4 GB of master + m + v
  int64_t sub_group = 8'000'000;
  int rounds = 5;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  IoOptions io_options;
  io_options.queue_depth = 32;
  try {
    zeroshard::bench::BenchArgs()
        .flag("--json", &json)
        .option("--dir", &dir)
        .option("--params", &params)
        .option("--sub-group", &sub_group)
        .option("--rounds", &rounds)
        .option("--threads", &threads)
        .option("--queue-depth", &io_options.queue_depth)
        .option("--block-size", &io_options.block_size)
        .parse(argc, argv);
    if (threads < 1) fail("--threads: {} is not allowed; use >= 1", threads);
    at::set_num_threads(threads);
    set_cpu_adam_threads(threads);
    fs::create_directories(dir);
    const int64_t need = params * 12 + (int64_t{1} << 30);
    if (free_bytes(dir) < need) {
      std::cerr << fmt::format("zs-bench-swap: needs {} bytes free under {}, has {}\n", need, dir,
                               free_bytes(dir));
      return 1;
    }
    IoEngine io(io_options);
    SwapDir swap(dir, "bench");
    MemoryLedger ledger;
    at::Tensor shard = at::randn({params});
    at::Tensor grad = at::randn({params}) * 1e-3;
    AdamHyper h;
    h.weight_decay = 0.01;

    OffloadOptimizerOptions o;
    o.device = OffloadDevice::Nvme;
    o.sub_group_numel = sub_group;
    o.buffer_count = 4;
    o.io = &io;
    o.swap_dir = swap.path();
    OffloadOptimizer nvme(o, &ledger);
    nvme.add_group(shard);
    nvme.start();
    o.device = OffloadDevice::Cpu;
    OffloadOptimizer host(o, &ledger);
    host.add_group(shard.clone());

    double t_step = 1e30, t_io = 1e30, t_adam = 1e30;
    SwapPassTimes step_phases;          // of the fastest step
    for (int r = 0; r < rounds; ++r) {  // interleaved, best of each
      t_io = std::min(t_io, bench::best_seconds([&] { nvme.io_pass(); }, 1));
      t_adam = std::min(t_adam, bench::best_seconds([&] { host.step({grad}, 1.0, h); }, 1));
      const double t = bench::best_seconds([&] { nvme.step({grad}, 1.0, h); }, 1);
      if (t < t_step) step_phases = nvme.last_swap_pass();
      t_step = std::min(t_step, t);
    }
    const double bound = std::max(t_io, t_adam);
    const double state_gb = params * 12 / 1e9;
    if (json) {
      std::cout << nlohmann::json{{"params", params},
                                  {"state_bytes", params * 12},
                                  {"sub_group_size", sub_group},
                                  {"buffer_count", 4},
                                  {"adam_threads", threads},
                                  {"queue_depth", io_options.queue_depth},
                                  {"block_size", io_options.block_size},
                                  {"step_seconds", t_step},
                                  {"pure_io_seconds", t_io},
                                  {"pure_adam_seconds", t_adam},
                                  {"overlap_ratio", t_step / bound},
                                  {"step_waiting_for_reads_seconds", step_phases.waiting_for_reads},
                                  {"step_adam_seconds", step_phases.updating},
                                  {"step_draining_writes_seconds", step_phases.draining}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::cout << fmt::format(
        "optimizer step over {}M fp32 parameters: {:.2f} GB of master+m+v on NVMe ({}), "
        "sub-groups of {}M, 4 pinned buffers, {} Adam threads, queue depth {}, {} KiB blocks, "
        "best of {} rounds\n",
        params / 1'000'000, state_gb, dir, sub_group / 1'000'000, threads, io_options.queue_depth,
        io_options.block_size / 1024, rounds);
    std::cout << fmt::format(
        "  pure I/O  (read + write, pipelined) {:7.3f} s  {:5.2f} GB/s each way\n", t_io,
        state_gb / t_io);
    std::cout << fmt::format("  pure Adam (state in host RAM)        {:7.3f} s\n", t_adam);
    std::cout << fmt::format(
        "  step with state on NVMe              {:7.3f} s  = {:.2f}x max(I/O, Adam)\n", t_step,
        t_step / bound);
    // Overlapped, the step waits for reads about pure I/O minus its Adam time; waiting
    // as long as pure I/O means the device moved nothing while Adam ran.
    std::cout << fmt::format(
        "    of which waiting for reads {:.3f} s (pure I/O - Adam in the step = {:.3f} s), "
        "Adam {:.3f} s, last writes {:.3f} s\n",
        step_phases.waiting_for_reads, t_io - step_phases.updating, step_phases.updating,
        step_phases.draining);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zs-bench-swap: " << e.what() << "\n";
    return 1;
  }
}
