// POSIX file-system helpers for the local backend: errors name the operation
// and the full path ("fsync /data/run-5: Input/output error").
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ckptio/status.h"
#include "ckptio/storage.h"

namespace ckptio::local {

// Owns a file descriptor; closes it (ignoring errors) unless released.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// "/root" + "a/b" -> "/root/a/b" (`rel` may be empty or end in '/').
std::string join_path(const std::string& root, std::string_view rel);

// Creates the directories of `rel` (a '/'-separated relative path, all of it)
// under the existing directory `root`. A directory created here is made
// durable by an fsync of its parent, so a durable file inside it is reachable.
Status make_dirs(const std::string& root, std::string_view rel);

Status fsync_dir(const std::string& path);

// pwrite()s all of `data` at `offset`, retrying short writes and EINTR.
Status write_fully(int fd, std::span<const std::byte> data, uint64_t offset, const std::string& path);
// pread()s exactly `len` bytes; a file that ends early is kDataLoss.
Status read_fully(int fd, std::byte* dst, uint64_t len, uint64_t offset, const std::string& path);

// Opens `key` (a checked key: no "..", no empty or "." components) beneath
// the directory `root` without following any symbolic link below `root` (the
// root itself may be one: the user chose it). A step directory is outside
// input: a data file or step directory replaced by a link to /etc/passwd or
// to another checkpoint must not be read through. Uses openat2(2) with
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS (Linux 5.6+), else walks the key
// component by component with O_NOFOLLOW: both race-free against a link
// swapped in between checks. A link anywhere in the key is kDataLoss naming
// the full path ("... is a symbolic link; ckptio never follows links inside
// a checkpoint"); other failures map from errno ("open <path>: ...").
// `flags` are open(2) flags (O_RDONLY, O_DIRECT, O_PATH...); O_CLOEXEC is
// added. On failure `*err` (when given) is the errno, or ELOOP for a link.
// A read-only open of anything but a file or a directory (a FIFO, whose
// open would block, a socket, a device) is kDataLoss (`*err` ENXIO).
// Beneath::kWalk skips openat2 (tests of the fallback).
enum class Beneath { kAuto, kWalk };
Result<UniqueFd> open_beneath(const std::string& root, std::string_view key, int flags, int* err = nullptr,
                              Beneath how = Beneath::kAuto);

// Removes `path` and everything below it; a missing path is OK.
Status remove_tree(const std::string& path);

// Adds to `out` the entries of directory `root`/`dir` (dir is "" or ends in
// '/') whose names start with `name_prefix`: regular files as objects,
// directories as prefixes (delimiter) or recursively (no delimiter). Keys are
// relative to `root`. A missing directory adds nothing.
Status list_dir(const std::string& root, const std::string& dir, std::string_view name_prefix,
                bool delimiter, ListResult& out);

// A file's modification time, ns since the Unix epoch.
int64_t mtime_ns(const struct stat& st);

// The newest modification time of the entries of directory `root`/`dir`
// (dir is "" or ends in '/') whose names start with `name_prefix`, and of
// everything below those that are directories (never through a link); with
// an empty `name_prefix`, of the directory itself too. nullopt if there is
// nothing.
Result<std::optional<int64_t>> newest_change(const std::string& root, const std::string& dir,
                                             std::string_view name_prefix);

}  // namespace ckptio::local
