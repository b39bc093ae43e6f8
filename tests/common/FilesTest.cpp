#include "common/Files.h"
#include "tests/common/TestPaths.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace zeroshard {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(zeroshard::testing::binary_dir()) / "test-scratch" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(FileWriter, AFinishedFileHoldsWhatWasWritten) {
  const fs::path path = fresh_dir("file-writer-finished") / "rank0.bin";
  FileWriter out(path.string(), "checkpoint");
  out.write("abc", 3);
  out.write("de", 2);
  out.finish();
  EXPECT_EQ(read_whole_file(path.string(), "test"), "abcde");
}

TEST(FileWriter, AWriterLeftUnfinishedRemovesItsFile) {
  const fs::path path = fresh_dir("file-writer-unfinished") / "rank0.bin.tmp";
  {
    FileWriter out(path.string(), "checkpoint");
    out.write("abc", 3);
    EXPECT_TRUE(fs::exists(path));
  }  // an error on its way up
  EXPECT_FALSE(fs::exists(path));
}

TEST(FileWriter, ErrorsNameWhoAndThePath) {
  const fs::path path = fresh_dir("file-writer-error") / "missing" / "rank0.bin";
  try {
    FileWriter out(path.string(), "checkpoint");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "checkpoint: cannot create '" + path.string() + "': No such file or directory");
  }
}

TEST(FreeBytes, IsKnownForAFolderAndUnknownForNothing) {
  EXPECT_GT(free_bytes(fresh_dir("free-bytes").string()), 0);
  EXPECT_EQ(free_bytes("/nonexistent/folder"), -1);
}

}  // namespace
}  // namespace zeroshard
