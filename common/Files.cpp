#include "common/Files.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/Error.h"

namespace zeroshard {

std::string read_whole_file(const std::string& path, const std::string& who) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: '{}' cannot be read: {}", who, path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

void publish_file(const std::string& tmp, const std::string& path, const std::string& who) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("{}: cannot rename '{}' to '{}': {}", who, tmp, path, std::strerror(e));
  }
  fsync_path(parent_of(path));
}

void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& who) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail("{}: cannot create '{}': {}", who, tmp, std::strerror(errno));
  auto give_up = [&](const char* what, int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("{}: {} '{}' failed: {}", who, what, tmp, std::strerror(e));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) give_up("writing", errno);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) give_up("syncing", errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("{}: closing '{}' failed: {}", who, tmp, std::strerror(e));
  }
  publish_file(tmp, path, who);
}

int64_t free_bytes(const std::string& path) {
  struct statvfs s {};
  if (statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

FileWriter::FileWriter(std::string path, std::string who)
    : path_(std::move(path)), who_(std::move(who)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd_ < 0) fail("{}: cannot create '{}': {}", who_, path_, std::strerror(errno));
}

FileWriter::~FileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());  // not finished: an error is on its way up
}

void FileWriter::write(const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) give_up("writing", errno);
    p += n;
    bytes -= n;
    written_ += n;
  }
}

void FileWriter::finish() {
  if (::fsync(fd_) != 0) give_up("syncing", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(path_.c_str());
    fail("{}: closing '{}' failed: {}", who_, path_, std::strerror(errno));
  }
  fd_ = -1;
}

void FileWriter::give_up(const char* what, int error) {
  const int64_t free = free_bytes(parent_of(path_));
  fail("{}: {} '{}' failed after {} bytes: {} (errno {}); {} bytes free there", who_, what, path_,
       written_, std::strerror(error), error, free >= 0 ? std::to_string(free) : "unknown");
}

}  // namespace zeroshard
