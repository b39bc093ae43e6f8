#pragma once
// Whole files in and out, the one place for each: reading a file the user named, and
// replacing a file so that a crash leaves the old one or the new one, never a mix.
#include <cstdint>
#include <string>

namespace zeroshard {

// Bytes free for an unprivileged writer on the file system holding `path` (-1: unknown).
int64_t free_bytes(const std::string& path);

// A file written piece by piece (a checkpoint's rank file) to `path`, then finish()ed:
// fsynced and closed. Any failure before that, a full disk most often, removes what was
// written, so it leaves no partial file taking the space. Errors name `who`.
class FileWriter {
 public:
  FileWriter(std::string path, std::string who);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(const void* data, int64_t bytes);
  void finish();

 private:
  [[noreturn]] void give_up(const char* what, int error);
  std::string path_, who_;
  int fd_ = -1;
  int64_t written_ = 0;
};

// The contents of `path`. Fails naming `who` (the key, option or format that named
// the file), the path and the reason.
std::string read_whole_file(const std::string& path, const std::string& who);

// Writes `bytes` to PATH.tmp, fsyncs it and publishes it (publish_file). Fails naming
// `who`; PATH is untouched then.
void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& who);

// Moves a written and synced `tmp` onto `path` and fsyncs the folder, so the rename
// itself survives a crash.
void publish_file(const std::string& tmp, const std::string& path, const std::string& who);

// fsync of a file or folder; a path that cannot be opened is left alone.
void fsync_path(const std::string& path);

// The folder part of `path` ("." for a bare name).
std::string parent_of(const std::string& path);

}  // namespace zeroshard
