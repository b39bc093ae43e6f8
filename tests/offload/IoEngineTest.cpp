// IoEngine and swap files on the real file system: data written comes back, short
// transfers are completed, errors name the file and offset, nothing is left behind.
#include "common/Files.h"
#include "offload/IoEngine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "tests/offload/Scratch.h"

#include "common/Error.h"
#include "offload/PinnedPool.h"
#include "offload/SwapFile.h"

using namespace zeroshard;
using zeroshard::testing::scratch_dir;
namespace fs = std::filesystem;

namespace {

void fill_random(void* p, int64_t bytes, unsigned seed) {
  std::mt19937 gen(seed);
  auto* u = static_cast<uint32_t*>(p);
  for (int64_t i = 0; i < bytes / 4; ++i) u[i] = gen();
}

struct Backend {
  const char* name;
  bool uring;
};

class IoEngineRoundTrip : public ::testing::TestWithParam<Backend> {};

TEST_P(IoEngineRoundTrip, WrittenBytesReadBackAcrossBlocksAndRings) {
  const std::string dir = scratch_dir(std::string("roundtrip-") + GetParam().name);
  SwapDir swap(dir, "test");
  constexpr int64_t kBytes = 9 * (64 << 10) + 3 * kIoAlignment;  // not a multiple of the block
  SwapFile file(swap.path(), "data", kBytes + (1 << 20));
  IoOptions o;
  o.block_size = 64 << 10;
  o.queue_depth = 4;
  o.rings = 2;
  o.use_io_uring = GetParam().uring;
  IoEngine io(o);
  EXPECT_EQ(io.uses_io_uring(), GetParam().uring);
  MemoryLedger ledger;
  PinnedPool pool(2, kBytes, &ledger);
  EXPECT_EQ(ledger.current(Tier::Host, Kind::PinnedBuffers), 2 * kBytes);
  fill_random(pool.buffer(0), kBytes, 7);
  io.write(file.file(), pool.buffer(0), kBytes, 1 << 20).get();
  std::memset(pool.buffer(1), 0, kBytes);
  io.read(file.file(), pool.buffer(1), kBytes, 1 << 20).get();
  EXPECT_EQ(std::memcmp(pool.buffer(0), pool.buffer(1), kBytes), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineRoundTrip,
                         ::testing::Values(Backend{"io_uring", true}, Backend{"threads", false}),
                         [](const auto& info) {
                           return std::string(info.param.name) == "io_uring" ? "IoUring"
                                                                             : "ThreadPool";
                         });

TEST(IoEngine, ShortTransfersAreCompletedForTheRemainder) {
  const std::string dir = scratch_dir("short");
  SwapDir swap(dir, "test");
  constexpr int64_t kBytes = 256 << 10;
  SwapFile file(swap.path(), "data", kBytes);
  IoOptions o;
  o.block_size = 128 << 10;
  IoEngine io(o);
  std::atomic<int> shortened{0};
  // The first completion of every piece reports half the bytes: the kernel really moved
  // them all, so the resubmitted remainder overwrites/reads the same bytes again.
  io.set_completion_hook([&](IoOp, const IoFile&, int64_t offset, int64_t length, int result) {
    if (result > 0 && length == (128 << 10) && offset % (128 << 10) == 0) {
      ++shortened;
      return result / 2;
    }
    return result;
  });
  MemoryLedger ledger;
  PinnedPool pool(2, kBytes, &ledger);
  fill_random(pool.buffer(0), kBytes, 11);
  io.write(file.file(), pool.buffer(0), kBytes, 0).get();
  io.read(file.file(), pool.buffer(1), kBytes, 0).get();
  EXPECT_EQ(std::memcmp(pool.buffer(0), pool.buffer(1), kBytes), 0);
  EXPECT_EQ(shortened.load(), 4);  // 2 pieces x (write + read)
}

TEST(IoEngine, AnIoErrorNamesOperationFileOffsetAndErrno) {
  const std::string dir = scratch_dir("eio");
  SwapDir swap(dir, "test");
  SwapFile file(swap.path(), "data", 1 << 20);
  IoOptions o;
  o.block_size = 256 << 10;
  IoEngine io(o);
  io.set_completion_hook([](IoOp op, const IoFile&, int64_t offset, int64_t, int result) {
    return op == IoOp::Read && offset == (512 << 10) ? -EIO : result;
  });
  MemoryLedger ledger;
  PinnedPool pool(1, 1 << 20, &ledger);
  try {
    io.read(file.file(), pool.buffer(0), 1 << 20, 0).get();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("read of 262144 bytes at offset 524288 of " + file.file().path),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("errno 5"), std::string::npos) << msg;
  }
}

TEST(IoEngine, ReadingPastTheEndIsAShortReadError) {
  const std::string dir = scratch_dir("eof");
  SwapDir swap(dir, "test");
  SwapFile file(swap.path(), "data", 64 << 10);
  IoEngine io(IoOptions{});
  MemoryLedger ledger;
  PinnedPool pool(1, 128 << 10, &ledger);
  try {
    io.read(file.file(), pool.buffer(0), 128 << 10, 0).get();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at offset 65536"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("file ends"), std::string::npos) << e.what();
  }
}

TEST(IoEngine, RejectsABlockSizeThatDirectIoCannotUse) {
  IoOptions o;
  o.block_size = 1000;
  try {
    IoEngine io(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aio.block_size: 1000"), std::string::npos);
  }
}

TEST(SwapFile, PreallocationFailsUpFrontWithBytesNeededAndFree) {
  const std::string dir = scratch_dir("enospc");
  SwapDir swap(dir, "test");
  const int64_t free_before = free_bytes(dir);
  const int64_t too_much = free_before + (int64_t{1} << 40);
  // The refusal must not take the disk's space even for a moment: other processes
  // (the other tests of this run among them) write there too.
  std::atomic<bool> done{false};
  std::atomic<int64_t> least_free{free_before};
  std::thread watch([&] {
    while (!done) {
      least_free = std::min<int64_t>(least_free, free_bytes(dir));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  try {
    SwapFile file(swap.path(), "huge", too_much);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(too_much) + " bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free there"), std::string::npos) << msg;
  }
  done = true;
  watch.join();
  EXPECT_GT(least_free, free_before / 2) << "free bytes fell from " << free_before;
  EXPECT_FALSE(fs::exists(swap.path() + "/huge.swap"));  // nothing half-made is left
}

TEST(SwapFile, FallsBackToBufferedIoWhereODirectIsRefused) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no tmpfs at /dev/shm";
  const std::string dir = "/dev/shm/zs-test-" + std::to_string(getpid());
  {
    const std::string probe = "/dev/shm/zs-probe-" + std::to_string(getpid());
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
    if (fd >= 0) GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT (Linux >= 6.6)";
  }
  {
    SwapDir swap(dir, "test");
    SwapFile file(swap.path(), "data", 1 << 20);
    EXPECT_FALSE(file.file().direct);  // tmpfs refuses O_DIRECT
    IoEngine io(IoOptions{});
    MemoryLedger ledger;
    PinnedPool pool(2, 1 << 20, &ledger);
    fill_random(pool.buffer(0), 1 << 20, 3);
    io.write(file.file(), pool.buffer(0), 1 << 20, 0).get();
    io.read(file.file(), pool.buffer(1), 1 << 20, 0).get();
    EXPECT_EQ(std::memcmp(pool.buffer(0), pool.buffer(1), 1 << 20), 0);
  }
  fs::remove_all(dir);
}

TEST(SwapDir, PrivateRemovedAtExitAndStaleOnesOfDeadProcessesRemoved) {
  const std::string dir = scratch_dir("stale");
  std::string mine;
  {
    SwapDir swap(dir, "rank0");
    mine = swap.path();
    struct stat st {};
    ASSERT_EQ(::stat(mine.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    SwapFile file(mine, "x", 4096);
    // A live owner's directory is not stale.
    EXPECT_EQ(SwapDir::remove_stale(dir), 0);
  }
  EXPECT_FALSE(fs::exists(mine));
  // A process that dies without cleaning up (as under SIGKILL) leaves its directory.
  const pid_t child = fork();
  if (child == 0) {
    SwapDir* leaked = new SwapDir(dir, "rank1");
    SwapFile* file = new SwapFile(leaked->path(), "opt", 1 << 20);
    (void)file;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  int left = 0;
  for (const auto& e : fs::directory_iterator(dir)) left += e.is_directory();
  ASSERT_EQ(left, 1);
  SwapDir next(dir, "rank1");  // the next run removes it and makes its own
  int now = 0;
  for (const auto& e : fs::directory_iterator(dir)) now += e.is_directory();
  EXPECT_EQ(now, 1);
  EXPECT_TRUE(fs::exists(next.path()));
}

TEST(SwapFile, RefusesToFollowAPlantedSymlink) {
  const std::string dir = scratch_dir("symlink");
  SwapDir swap(dir, "test");
  const std::string target = dir + "/victim";
  { std::ofstream(target) << "keep"; }
  fs::create_symlink(target, swap.path() + "/data.swap");
  EXPECT_THROW(SwapFile(swap.path(), "data", 4096), Error);
  std::ifstream in(target);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "keep");
}

}  // namespace
