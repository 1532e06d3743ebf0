#include "backends/local/fs.h"

#include <atomic>
#include <cerrno>
#include <memory>

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backends/local/keys.h"

namespace ckptio::local {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string join_path(const std::string& root, std::string_view rel) {
  while (!rel.empty() && rel.back() == '/') rel.remove_suffix(1);
  if (rel.empty()) return root;
  std::string out = root;
  if (out.empty() || out.back() != '/') out += '/';
  out += rel;
  return out;
}

Status fsync_dir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::from_errno(errno, "open directory " + path);
  if (::fsync(fd.get()) != 0) return Status::from_errno(errno, "fsync " + path);
  return Status::OK();
}

Status make_dirs(const std::string& root, std::string_view rel) {
  std::string path = root;
  size_t start = 0;
  while (start < rel.size()) {
    size_t end = rel.find('/', start);
    if (end == std::string_view::npos) end = rel.size();
    std::string parent = path;
    path = join_path(path, rel.substr(start, end - start));
    start = end + 1;
    if (::mkdir(path.c_str(), 0755) == 0) {
      if (Status st = fsync_dir(parent); !st.ok()) {
        // Not left behind: a retry would find it there and take it for
        // durable. (Unless another thread put something in it meanwhile;
        // the commit's own fsyncs of the stage and the base cover a step.)
        (void)::rmdir(path.c_str());
        return st;
      }
    } else if (errno != EEXIST) {
      return Status::from_errno(errno, "mkdir " + path);
    }
  }
  return Status::OK();
}

Status write_fully(int fd, std::span<const std::byte> data, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write " + path + " at offset " + std::to_string(offset + done));
    }
    if (n == 0) return io_error("write " + path + ": wrote 0 bytes");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status read_fully(int fd, std::byte* dst, uint64_t len, uint64_t offset, const std::string& path) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, dst + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read " + path + " at offset " + std::to_string(offset + done));
    }
    if (n == 0)
      return data_loss("read " + path + ": file ends at " + std::to_string(offset + done) +
                       ", before the requested range [" + std::to_string(offset) + ", " +
                       std::to_string(offset + len) + ") ends");
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

namespace {

Status link_refused(const std::string& path) {
  return data_loss("open " + path + ": a symbolic link inside the checkpoint (ckptio never follows links "
                   "below its root: a link could point outside it)");
}

// openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; -1 with errno, ENOSYS
// when the kernel (or a seccomp filter) lacks it.
int openat2_beneath(int dirfd, const std::string& rel, int flags) {
#ifdef SYS_openat2
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags) | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
  for (;;) {
    long fd = ::syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof how);
    if (fd >= 0 || errno != EAGAIN) return static_cast<int>(fd);  // EAGAIN: a rename raced; retry
  }
#else
  (void)dirfd, (void)rel, (void)flags;
  errno = ENOSYS;
  return -1;
#endif
}

std::atomic<bool> g_no_openat2{false};

}  // namespace

Result<UniqueFd> open_beneath(const std::string& root, std::string_view key, int flags, int* err_out,
                              Beneath how) {
  const std::string path = join_path(root, key);
  auto failed = [&](int e, Status st) {
    if (err_out) *err_out = e;
    return st;
  };
  // A read never waits on what is not a file: the open of a FIFO blocks
  // until a writer comes (discovery, restore and cp hung on one planted in a
  // step). Opened without blocking, refused unless a file or a directory,
  // then blocking again (on a file, O_NONBLOCK would make io_uring answer
  // -EAGAIN instead of waiting for the disk).
  const bool plain_read = (flags & (O_PATH | O_DIRECTORY)) == 0 && (flags & O_ACCMODE) == O_RDONLY;
  if (plain_read) flags |= O_NONBLOCK;
  // O_PATH | O_NOFOLLOW opens a trailing link itself instead of failing.
  auto checked = [&](int fd) -> Result<UniqueFd> {
    UniqueFd opened(fd);
    struct stat st;
    if ((flags & O_PATH) && ::fstat(opened.get(), &st) == 0 && S_ISLNK(st.st_mode))
      return failed(ELOOP, link_refused(path));
    if (plain_read) {
      if (::fstat(opened.get(), &st) != 0) {
        const int e = errno;
        return failed(e, Status::from_errno(e, "stat " + path));
      }
      if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        return failed(ENXIO, data_loss("open " + path + ": neither a file nor a directory (a FIFO, socket or "
                                       "device inside the checkpoint)"));
      const int fl = ::fcntl(opened.get(), F_GETFL);
      if (fl == -1 || ::fcntl(opened.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) {
        const int e = errno;
        return failed(e, Status::from_errno(e, "fcntl " + path));
      }
    }
    return opened;
  };
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) {
    const int e = errno;
    return failed(e, Status::from_errno(e, "open directory " + root));
  }
  if (how == Beneath::kAuto && !g_no_openat2.load(std::memory_order_relaxed)) {
    int fd = openat2_beneath(dir.get(), std::string(key), flags);
    if (fd >= 0) return checked(fd);
    const int e = errno;
    if (e == ELOOP || e == EXDEV) return failed(ELOOP, link_refused(path));
    if (e != ENOSYS && e != EPERM) return failed(e, Status::from_errno(e, "open " + path));
    // ENOSYS: an old kernel; EPERM: a seccomp filter refusing the syscall
    // (a real permission problem shows again in the walk below).
    g_no_openat2.store(true, std::memory_order_relaxed);
  }
  // Component by component, never following a link.
  std::string_view rest = key;
  while (true) {
    const size_t slash = rest.find('/');
    const std::string name(rest.substr(0, slash));
    const bool last = slash == std::string_view::npos;
    const int f = last ? (flags | O_NOFOLLOW | O_CLOEXEC) : (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = ::openat(dir.get(), name.c_str(), f);
    if (fd < 0) {
      const int e = errno;
      struct stat st;
      // ELOOP: the last component is a link; ENOTDIR: a middle one may be.
      if ((e == ELOOP || e == ENOTDIR) && ::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode))
        return failed(ELOOP, link_refused(path));
      return failed(e, Status::from_errno(e, "open " + path));
    }
    if (last) return checked(fd);
    dir = UniqueFd(fd);
    rest.remove_prefix(slash + 1);
  }
}

namespace {

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

}  // namespace

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

namespace {

// Removes every entry of the open directory `dfd` (consumed) named `path`.
Status empty_dir(int dfd, const std::string& path) {
  DirPtr dir(::fdopendir(dfd));
  if (!dir) {
    int err = errno;
    ::close(dfd);
    return Status::from_errno(err, "opendir " + path);
  }
  Status first;
  while (true) {
    errno = 0;
    dirent* e = ::readdir(dir.get());
    if (!e) {
      if (errno != 0 && first.ok()) first = Status::from_errno(errno, "readdir " + path);
      break;
    }
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string child = path + "/" + e->d_name;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      if (::fstatat(::dirfd(dir.get()), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno != ENOENT && first.ok()) first = Status::from_errno(errno, "stat " + child);
        continue;
      }
      is_dir = S_ISDIR(st.st_mode);
    }
    if (!is_dir) {
      if (::unlinkat(::dirfd(dir.get()), e->d_name, 0) != 0 && errno != ENOENT && first.ok())
        first = Status::from_errno(errno, "unlink " + child);
      continue;
    }
    int cfd = ::openat(::dirfd(dir.get()), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cfd < 0) {
      if (errno != ENOENT && first.ok()) first = Status::from_errno(errno, "open directory " + child);
      continue;
    }
    Status st = empty_dir(cfd, child);
    if (st.ok() && ::unlinkat(::dirfd(dir.get()), e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT)
      st = Status::from_errno(errno, "rmdir " + child);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

}  // namespace

Status remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Status::OK();
    return Status::from_errno(errno, "stat " + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Status::from_errno(errno, "unlink " + path);
    return Status::OK();
  }
  int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::from_errno(errno, "open directory " + path);
  }
  CKPTIO_RETURN_IF_ERROR(empty_dir(dfd, path));
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return Status::from_errno(errno, "rmdir " + path);
  return Status::OK();
}

Status newest_at(int dfd, const char* name, const std::string& path, std::optional<int64_t>& newest);

namespace {

// Calls fn(dir_fd, entry) for every entry of the open directory `dfd`
// (consumed) named `path`, but "." and "..", until fn returns an error.
template <typename Fn>
Status for_each_entry(int dfd, const std::string& path, Fn&& fn) {
  DirPtr d(::fdopendir(dfd));
  if (!d) {
    int err = errno;
    ::close(dfd);
    return Status::from_errno(err, "opendir " + path);
  }
  while (true) {
    errno = 0;
    dirent* e = ::readdir(d.get());
    if (!e) return errno != 0 ? Status::from_errno(errno, "readdir " + path) : Status::OK();
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    CKPTIO_RETURN_IF_ERROR(fn(::dirfd(d.get()), *e));
  }
}

// The newest mtime of the open directory `dfd` (consumed) named `path`, of
// everything in it and, recursively, in its subdirectories (never through a
// link). Entries that vanish meanwhile are skipped.
Status newest_in_dir(int dfd, const std::string& path, std::optional<int64_t>& newest) {
  struct stat st;
  if (::fstat(dfd, &st) != 0) {
    int err = errno;
    ::close(dfd);
    return Status::from_errno(err, "stat " + path);
  }
  newest = std::max(newest.value_or(mtime_ns(st)), mtime_ns(st));
  return for_each_entry(dfd, path, [&](int at, const dirent& e) {
    return newest_at(at, e.d_name, path + "/" + e.d_name, newest);
  });
}

}  // namespace

// Entry `name` of the directory `dfd`, named `path`: its mtime, and if it is
// a directory (not a link), everything below it.
Status newest_at(int dfd, const char* name, const std::string& path, std::optional<int64_t>& newest) {
  struct stat st;
  if (::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::from_errno(errno, "stat " + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    newest = std::max(newest.value_or(mtime_ns(st)), mtime_ns(st));
    return Status::OK();
  }
  int cfd = ::openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (cfd < 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::from_errno(errno, "open directory " + path);
  }
  return newest_in_dir(cfd, path, newest);
}

Result<std::optional<int64_t>> newest_change(const std::string& root, const std::string& dir,
                                             std::string_view name_prefix) {
  const std::string path = join_path(root, dir);
  std::optional<int64_t> newest;
  int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return newest;
    return Status::from_errno(errno, "open directory " + path);
  }
  if (name_prefix.empty()) {  // the directory itself and all below it
    CKPTIO_RETURN_IF_ERROR(newest_in_dir(dfd, path, newest));
    return newest;
  }
  CKPTIO_RETURN_IF_ERROR(for_each_entry(dfd, path, [&](int at, const dirent& e) {
    if (std::string_view(e.d_name).substr(0, name_prefix.size()) != name_prefix) return Status::OK();
    return newest_at(at, e.d_name, path + "/" + e.d_name, newest);
  }));
  return newest;
}

Status list_dir(const std::string& root, const std::string& dir, std::string_view name_prefix,
                bool delimiter, ListResult& out) {
  const std::string path = join_path(root, dir);
  int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Status::OK();  // nothing there
    return Status::from_errno(errno, "open directory " + path);
  }
  return for_each_entry(dfd, path, [&](int at, const dirent& e) -> Status {
    std::string_view name = e.d_name;
    if (name.substr(0, name_prefix.size()) != name_prefix) return Status::OK();
    // Symlinks are followed for files; a symlinked directory is listed as a
    // prefix but never descended into (no cycles).
    struct stat st;
    if (::fstatat(at, e.d_name, &st, 0) != 0) {
      if (errno == ENOENT) return Status::OK();  // removed meanwhile, or a dangling link
      return Status::from_errno(errno, "stat " + path + "/" + e.d_name);
    }
    bool is_link = e.d_type == DT_LNK;
    if (e.d_type == DT_UNKNOWN) {
      struct stat lst;
      is_link = ::fstatat(at, e.d_name, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode);
    }
    const std::string key = dir + e.d_name;
    if (S_ISREG(st.st_mode)) {
      if (!is_temp_name(name)) out.objects.push_back({key, static_cast<uint64_t>(st.st_size), mtime_ns(st)});
    } else if (S_ISDIR(st.st_mode)) {
      if (delimiter) out.prefixes.push_back(key + "/");
      else if (!is_link) return list_dir(root, key + "/", "", false, out);
    }
    return Status::OK();
  });
}

}  // namespace ckptio::local
