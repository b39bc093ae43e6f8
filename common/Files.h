#pragma once
// Whole files in and out, the one place for each: reading a file the user named, and
// replacing a file so that a crash leaves the old one or the new one, never a mix.
#include <string>

namespace zeroshard {

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
