#include "offload/SwapFile.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/Bytes.h"
#include "common/Error.h"
#include "common/Files.h"
#include "common/Logging.h"

namespace zeroshard {
namespace {

constexpr const char* kPrefix = "zeroshard-swap-";
constexpr const char* kLockName = ".owner";

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

// Removes a swap directory's own files (swap files and the lock) and the directory;
// anything else in it is left, and so is the directory then.
void remove_swap_dir(const std::string& dir) {
  for (const auto& name : entries(dir)) {
    const bool swap = name.size() > 5 && name.substr(name.size() - 5) == ".swap";
    const bool ours = name == kLockName || name == std::string(kLockName) + ".new" || swap;
    if (ours) ::unlink((dir + "/" + name).c_str());
  }
  ::rmdir(dir.c_str());
}

}  // namespace

SwapDir::SwapDir(const std::string& nvme_path, const std::string& tag) {
  if (nvme_path.empty()) fail("nvme_path: empty; set it to a directory on a local NVMe drive");
  if (::mkdir(nvme_path.c_str(), 0700) != 0 && errno != EEXIST) {
    fail("nvme_path: cannot create '{}': {}", nvme_path, std::strerror(errno));
  }
  remove_stale(nvme_path);
  std::string templ = fmt::format("{}/{}{}-XXXXXX", nvme_path, kPrefix, tag);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {  // mode 0700
    fail("nvme_path: cannot create a swap directory in '{}': {}", nvme_path, std::strerror(errno));
  }
  path_ = buf.data();
  // The lock is taken under another name and then renamed into place: a process
  // sweeping stale directories must never find the lock file unlocked and remove a
  // directory that is being born (seen with two ranks starting together).
  const std::string lock = path_ + "/" + kLockName;
  const std::string unborn = lock + ".new";
  lock_fd_ = ::open(unborn.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0 ||
      ::rename(unborn.c_str(), lock.c_str()) != 0) {
    fail("cannot lock swap directory '{}': {}", path_, std::strerror(errno));
  }
}

SwapDir::~SwapDir() {
  remove_swap_dir(path_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

int SwapDir::remove_stale(const std::string& nvme_path) {
  int removed = 0;
  for (const auto& name : entries(nvme_path)) {
    if (!starts_with(name, kPrefix)) continue;
    const std::string dir = nvme_path + "/" + name;
    const int fd = ::open((dir + "/" + kLockName).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;  // not (yet) a complete swap directory: not ours to judge
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      log_info("removing swap directory '{}' left by a process that ended", dir);
      remove_swap_dir(dir);
      ++removed;
    }
    ::close(fd);
  }
  return removed;
}

SwapFile::SwapFile(const std::string& dir, const std::string& name, int64_t bytes) : bytes_(bytes) {
  file_.path = dir + "/" + name + ".swap";
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  file_.fd = ::open(file_.path.c_str(), flags | O_DIRECT, 0600);
  file_.direct = file_.fd >= 0;
  if (file_.fd < 0 && errno == EINVAL) {
    log_warn("the file system of '{}' refuses O_DIRECT; swap I/O goes through the page cache", dir);
    file_.fd = ::open(file_.path.c_str(), flags, 0600);
  }
  if (file_.fd < 0) fail("cannot create swap file '{}': {}", file_.path, std::strerror(errno));
  if (bytes <= 0) return;
  try {
    reserve(0, bytes);
  } catch (...) {
    ::close(file_.fd);
    ::unlink(file_.path.c_str());
    throw;
  }
}

void SwapFile::grow(int64_t bytes) {
  if (bytes <= bytes_) return;
  reserve(bytes_, bytes - bytes_);
  bytes_ = bytes;
}

void SwapFile::reserve(int64_t offset, int64_t length) {
  // A request larger than the free space is refused before fallocate: ext4 allocates
  // extent by extent and fails only when the disk is full, so asking anyway fills the
  // disk for every other process until the file is removed (a concurrent test saw
  // ENOSPC in CI that way).
  const std::string dir = file_.path.substr(0, file_.path.rfind('/'));
  const int64_t avail = free_bytes(dir);
  int rc = avail >= 0 && length > avail ? ENOSPC : ::posix_fallocate(file_.fd, offset, length);
  if (rc == EOPNOTSUPP || rc == EINVAL)
    rc = ::ftruncate(file_.fd, offset + length) == 0 ? 0 : errno;
  if (rc != 0) {
    const int64_t now_free = free_bytes(dir);
    fail("cannot reserve {} ({} bytes) for swap file '{}': {}; {} free there", format_gib(length),
         length, file_.path, std::strerror(rc), now_free >= 0 ? format_gib(now_free) : "unknown");
  }
}

SwapFile::~SwapFile() {
  if (file_.fd >= 0) ::close(file_.fd);
  ::unlink(file_.path.c_str());
}

}  // namespace zeroshard
