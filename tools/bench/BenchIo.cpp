// zs bench io: IoEngine's sequential write and read of one file beside fio's, same
// block size, queue depth, O_DIRECT and io_uring, on the same directory, the runs
// interleaved (fio, ours, fio, ours...) so drift hits both alike. Best of N each.
// usage: zs-bench-io [--json] [--dir DIR] [--size-mib N] [--rounds N]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/MemoryLedger.h"
#include "offload/IoEngine.h"
#include "offload/PinnedPool.h"
#include "offload/SwapFile.h"
#include "tools/bench/BenchArgs.h"

using namespace zeroshard;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBlock = 1 << 20;
constexpr int kDepth = 32;

double fio_bytes_per_s(const std::string& file, int64_t bytes, const std::string& rw) {
  const std::string cmd = fmt::format(
      "fio --name=zs --filename={} --size={} --bs={} --iodepth={} --direct=1 "
      "--ioengine=io_uring --rw={} --output-format=json 2>/dev/null",
      file, bytes, kBlock, kDepth, rw);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot start fio");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  if (pclose(pipe) != 0) throw std::runtime_error("fio failed: " + cmd);
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  const auto& job = j["jobs"][0][rw == "write" ? "write" : "read"];
  return job["bw_bytes"].get<double>();
}

double ours_bytes_per_s(IoEngine& io, const IoFile& file, void* buffer, int64_t bytes, bool write) {
  const auto t0 = std::chrono::steady_clock::now();
  (write ? io.write(file, buffer, bytes, 0) : io.read(file, buffer, bytes, 0)).get();
  return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string dir = "build/bench-io";
  int64_t size_mib = 1024;
  int rounds = 3;
  try {
    zeroshard::bench::BenchArgs()
        .flag("--json", &json)
        .option("--dir", &dir)
        .option("--size-mib", &size_mib)
        .option("--rounds", &rounds)
        .parse(argc, argv);
    fs::create_directories(dir);
    const int64_t bytes = size_mib << 20;
    const std::string fio_file = dir + "/fio.dat";
    SwapDir swap(dir, "bench");
    SwapFile file(swap.path(), "io", bytes);
    IoOptions o;
    o.block_size = kBlock;
    o.queue_depth = kDepth;
    IoEngine io(o);
    MemoryLedger ledger;
    PinnedPool pool(1, bytes, &ledger);
    io.register_buffers(pool.all());
    std::memset(pool.buffer(0), 0x5a, static_cast<size_t>(bytes));
    double fio_w = 0, fio_r = 0, our_w = 0, our_r = 0;
    for (int r = 0; r < rounds; ++r) {
      fio_w = std::max(fio_w, fio_bytes_per_s(fio_file, bytes, "write"));
      our_w = std::max(our_w, ours_bytes_per_s(io, file.file(), pool.buffer(0), bytes, true));
      fio_r = std::max(fio_r, fio_bytes_per_s(fio_file, bytes, "read"));
      our_r = std::max(our_r, ours_bytes_per_s(io, file.file(), pool.buffer(0), bytes, false));
    }
    fs::remove(fio_file);
    if (json) {
      std::cout << nlohmann::json{{"bytes", bytes},
                                  {"block_size", kBlock},
                                  {"queue_depth", kDepth},
                                  {"io_uring", io.uses_io_uring()},
                                  {"o_direct", file.file().direct},
                                  {"read_gb_per_s", our_r / 1e9},
                                  {"write_gb_per_s", our_w / 1e9},
                                  {"fio_read_gb_per_s", fio_r / 1e9},
                                  {"fio_write_gb_per_s", fio_w / 1e9},
                                  {"read_ratio_vs_fio", our_r / fio_r},
                                  {"write_ratio_vs_fio", our_w / fio_w}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::cout << fmt::format(
        "{} MiB sequential, {} KiB blocks, queue depth {}, O_DIRECT {}, io_uring {}, best of {}\n",
        size_mib, kBlock >> 10, kDepth, file.file().direct ? "on" : "off (refused)",
        io.uses_io_uring() ? "yes" : "no (thread pool)", rounds);
    std::cout << fmt::format("  write  IoEngine {:6.2f} GB/s   fio {:6.2f} GB/s   ratio {:.2f}\n",
                             our_w / 1e9, fio_w / 1e9, our_w / fio_w);
    std::cout << fmt::format("  read   IoEngine {:6.2f} GB/s   fio {:6.2f} GB/s   ratio {:.2f}\n",
                             our_r / 1e9, fio_r / 1e9, our_r / fio_r);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zs-bench-io: " << e.what() << "\n";
    return 1;
  }
}
