#include "common/Files.h"

#include <fcntl.h>
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

}  // namespace zeroshard
