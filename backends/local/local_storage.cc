// LocalStorage: the Storage interface over a directory tree.
//
// Durability protocol of the small-object and namespace operations (data
// files: see writer.cc):
//   put(key):     write "<key>.tmp-ckptio-<random>", fsync it, rename it over
//                 the key, fsync the key's directory. Readers see the old or
//                 the new file, never a mix; after put() returns, a power cut
//                 keeps the new file. Any error unlinks the temporary.
//   put_new(key): the same with renameat2(RENAME_NOREPLACE): EEXIST is
//                 kAlreadyExists (and the key's file is left as it was).
//   directories:  make_dirs() fsyncs the parent of every directory it creates,
//                 so a durable file is never left in an unreachable directory.
//   rename(a, b): renameat2 (RENAME_NOREPLACE or RENAME_EXCHANGE), then fsync
//                 the parent directory of b (and of a when it differs).
//   sync(prefix): fsync the directory holding the entries under prefix.
// fsync errors are returned, never retried or swallowed: after a failed fsync
// the kernel may have dropped the dirty pages, so a retry could "succeed"
// without the data.
#include "backends/local/local_storage.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string_view>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/local/fs.h"
#include "backends/local/keys.h"
#include "backends/local/pread_pool.h"
#include "backends/local/reader.h"
#include "backends/local/ring.h"
#include "backends/local/writer.h"

namespace ckptio {

namespace local {
namespace {

// Measured defaults (docs/library.md, "Request size, queue depth and read mode"; tests/local_storage_test.cc
// LocalStorageBench reproduces them).
constexpr uint64_t kDefaultRequestSize = 8ull << 20;
constexpr uint32_t kDefaultQueueDepth = 32;
constexpr ReadMode kDefaultReadMode = ReadMode::kDirect;
constexpr unsigned kPreadHelpers = 2;  // plus the calling thread

std::string parent_of(std::string_view key) {
  size_t slash = key.rfind('/');
  return slash == std::string_view::npos ? std::string() : std::string(key.substr(0, slash));
}

class LocalStorage final : public Storage {
 public:
  LocalStorage(std::string root, std::shared_ptr<Ring> ring, WriterOptions wopts, ReadSettings ropts)
      : root_(std::move(root)), ring_(std::move(ring)), writer_options_(wopts), read_settings_(ropts),
        pool_(kPreadHelpers) {}

  StorageCaps caps() const override { return {.atomic_rename = true, .atomic_exchange = true}; }
  std::string describe() const override { return root_; }

  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    CKPTIO_RETURN_IF_ERROR(check_key(key));
    CKPTIO_RETURN_IF_ERROR(make_dirs(root_, parent_of(key)));
    return open_writer(ring_, join_path(root_, key), size_hint, writer_options_);
  }

  Status put(const std::string& key, std::span<const std::byte> data) override { return put(key, data, true); }
  Status put_new(const std::string& key, std::span<const std::byte> data) override { return put(key, data, false); }
  Result<std::string> get(const std::string& key, uint64_t max_size) override;
  Result<uint64_t> stat(const std::string& key) override;
  Result<std::unique_ptr<ObjectReader>> open(const std::string& key, uint64_t max_size) override;

  Status read(std::span<const ReadRequest> requests) override {
    return read_files(root_, requests, read_settings_, *ring_, pool_);
  }
  Result<std::unique_ptr<ObjectView>> view_cached(const std::string& key) override {
    CKPTIO_RETURN_IF_ERROR(check_key(key));
    return view_cached_file(root_, key, read_settings_.direct_io);
  }
  // What writers report: 4096 for O_DIRECT files. A file system that
  // refuses O_DIRECT gets buffered writers of granularity 1, which 4096 is a
  // multiple of, so ranges cut to 4096 suit both.
  uint64_t write_granularity() const override {
    return writer_options_.direct != DirectIo::kOff ? 4096 : 1;
  }
  uint64_t write_memory_alignment() const override { return write_granularity(); }
  uint64_t read_alignment() const override {
    return read_settings_.mode == ReadMode::kDirect && writer_options_.direct != DirectIo::kOff ? 4096 : 1;
  }

  Result<ListResult> list(const std::string& prefix, bool delimiter) override;
  Result<std::optional<int64_t>> newest_change(const std::string& prefix) override {
    CKPTIO_RETURN_IF_ERROR(check_prefix(prefix));
    auto [dir, name] = split_prefix(prefix);
    return local::newest_change(root_, std::string(dir), name);
  }
  Status remove(const std::string& key) override;
  Status remove_prefix(const std::string& prefix) override;
  Status rename(const std::string& from, const std::string& to, RenameMode mode) override;
  Status sync(const std::string& prefix) override;

 private:
  Status put(const std::string& key, std::span<const std::byte> data, bool replace);

  const std::string root_;  // absolute, no trailing '/'
  const std::shared_ptr<Ring> ring_;
  const WriterOptions writer_options_;
  const ReadSettings read_settings_;
  PreadPool pool_;
};

Status LocalStorage::put(const std::string& key, std::span<const std::byte> data, bool replace) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  const std::string dir = parent_of(key);
  CKPTIO_RETURN_IF_ERROR(make_dirs(root_, dir));
  const std::string path = join_path(root_, key);
  const std::string temp = temp_path_for(path);
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::from_errno(errno, "create " + path);
  Status st = write_fully(fd, data, 0, path);
  if (st.ok() && ::fsync(fd) != 0) st = Status::from_errno(errno, "fsync " + path);
  if (::close(fd) != 0 && st.ok()) st = Status::from_errno(errno, "close " + path);
  if (st.ok() && replace && ::rename(temp.c_str(), path.c_str()) != 0)
    st = Status::from_errno(errno, "rename " + temp + " to " + path);
  if (st.ok() && !replace && ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0)
    st = errno == EEXIST ? Status(Code::kAlreadyExists, path + " already exists")
                         : Status::from_errno(errno, "rename " + temp + " to " + path + " (no replace)");
  if (!st.ok()) {
    ::unlink(temp.c_str());
    return st;
  }
  return fsync_dir(join_path(root_, dir));
}

Result<std::string> LocalStorage::get(const std::string& key, uint64_t max_size) {
  CKPTIO_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> object, open(key, max_size));
  std::string out(object->size(), '\0');
  CKPTIO_RETURN_IF_ERROR(object->read(0, out.size(), reinterpret_cast<std::byte*>(out.data())));
  return out;
}

namespace {

// The file as it was opened (its descriptor): a rename over its path
// meanwhile does not change what is read.
class FileReader final : public ObjectReader {
 public:
  FileReader(UniqueFd fd, uint64_t size, std::string path) : fd_(std::move(fd)), size_(size), path_(std::move(path)) {}
  uint64_t size() const override { return size_; }
  Status read(uint64_t offset, uint64_t length, std::byte* dst) override {
    return read_fully(fd_.get(), dst, length, offset, path_);
  }

 private:
  const UniqueFd fd_;
  const uint64_t size_;
  const std::string path_;
};

}  // namespace

Result<std::unique_ptr<ObjectReader>> LocalStorage::open(const std::string& key, uint64_t max_size) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  const std::string path = join_path(root_, key);
  CKPTIO_ASSIGN_OR_RETURN(UniqueFd fd, open_beneath(root_, key, O_RDONLY));  // never through a link
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "stat " + path);
  if (S_ISDIR(st.st_mode)) return not_found("open " + path + ": is a directory, not an object");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_size)
    return invalid_argument("open " + path + ": " + std::to_string(size) + " bytes exceeds the limit of " +
                            std::to_string(max_size));
  return std::unique_ptr<ObjectReader>(std::make_unique<FileReader>(std::move(fd), size, path));
}

Result<uint64_t> LocalStorage::stat(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  const std::string path = join_path(root_, key);
  CKPTIO_ASSIGN_OR_RETURN(UniqueFd fd, open_beneath(root_, key, O_PATH));  // never through a link
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return not_found("stat " + path + ": not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

Result<ListResult> LocalStorage::list(const std::string& prefix, bool delimiter) {
  CKPTIO_RETURN_IF_ERROR(check_prefix(prefix));
  auto [dir, name] = split_prefix(prefix);
  ListResult out;
  CKPTIO_RETURN_IF_ERROR(list_dir(root_, std::string(dir), name, delimiter, out));
  std::sort(out.objects.begin(), out.objects.end(),
            [](const ListEntry& a, const ListEntry& b) { return a.key < b.key; });
  std::sort(out.prefixes.begin(), out.prefixes.end());
  return out;
}

Status LocalStorage::remove(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  const std::string path = join_path(root_, key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR)
    return Status::from_errno(errno, "unlink " + path);
  return Status::OK();
}

Status LocalStorage::remove_prefix(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(check_prefix(prefix));
  if (!prefix.empty() && prefix.back() == '/') return remove_tree(join_path(root_, prefix));
  // Every key starting with `prefix`: the matching entries of its directory.
  auto [dir, name] = split_prefix(prefix);
  const std::string dir_path = join_path(root_, dir);
  std::vector<std::string> doomed;
  {
    DIR* d = ::opendir(dir_path.c_str());
    if (!d) {
      if (errno == ENOENT || errno == ENOTDIR) return Status::OK();
      return Status::from_errno(errno, "open directory " + dir_path);
    }
    while (dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n == "." || n == "..") continue;
      if (n.substr(0, name.size()) == name) doomed.emplace_back(n);
    }
    ::closedir(d);
  }
  Status first;
  for (const std::string& n : doomed) {
    Status st = remove_tree(dir_path + "/" + n);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status LocalStorage::rename(const std::string& from, const std::string& to, RenameMode mode) {
  CKPTIO_RETURN_IF_ERROR(check_prefix(from));
  CKPTIO_RETURN_IF_ERROR(check_prefix(to));
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.back() == '/') s.remove_suffix(1);
    return std::string(s);
  };
  const std::string a = trim(from), b = trim(to);
  if (a.empty() || b.empty()) return invalid_argument("rename '" + from + "' to '" + to + "': the root cannot move");
  if ((from.back() == '/') != (to.back() == '/'))
    return invalid_argument("rename '" + from + "' to '" + to + "': a prefix and a key cannot swap");
  const std::string src = join_path(root_, a), dst = join_path(root_, b);
  unsigned flags = RENAME_NOREPLACE;
  if (mode == RenameMode::kExchange) {
    flags = RENAME_EXCHANGE;
  } else {
    CKPTIO_RETURN_IF_ERROR(make_dirs(root_, parent_of(b)));
  }
  if (::renameat2(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), flags) != 0) {
    const char* how = mode == RenameMode::kExchange ? " (exchange)" : " (no replace)";
    return Status::from_errno(errno, "rename " + src + " to " + dst + how);
  }
  const std::string src_dir = join_path(root_, parent_of(a)), dst_dir = join_path(root_, parent_of(b));
  CKPTIO_RETURN_IF_ERROR(fsync_dir(dst_dir));
  if (src_dir != dst_dir) CKPTIO_RETURN_IF_ERROR(fsync_dir(src_dir));
  return Status::OK();
}

Status LocalStorage::sync(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(check_prefix(prefix));
  // "run-5/" names a directory; "run-" names entries of the root.
  std::string_view dir = prefix;
  if (!dir.empty() && dir.back() != '/') dir = split_prefix(prefix).first;
  return fsync_dir(join_path(root_, dir));
}

Result<DirectIo> parse_direct_io(const std::string& s) {
  if (s.empty() || s == "auto") return DirectIo::kAuto;
  if (s == "on") return DirectIo::kOn;
  if (s == "off") return DirectIo::kOff;
  return invalid_argument("direct_io '" + s + "': expected auto, on or off");
}

Result<ReadMode> parse_read_mode(const std::string& s) {
  if (s.empty()) return kDefaultReadMode;
  if (s == "direct") return ReadMode::kDirect;
  if (s == "buffered") return ReadMode::kBuffered;
  return invalid_argument("read_mode '" + s + "': expected direct, buffered or empty");
}

}  // namespace
}  // namespace local

Result<std::shared_ptr<Storage>> make_local_storage(const std::string& root_in, const LocalOptions& options) {
  using namespace local;
  CKPTIO_ASSIGN_OR_RETURN(DirectIo direct, parse_direct_io(options.direct_io));
  CKPTIO_ASSIGN_OR_RETURN(ReadMode mode, parse_read_mode(options.read_mode));
  if (root_in.empty()) return invalid_argument("local storage: empty root path");
  if (root_in.find('\0') != std::string::npos) return invalid_argument("local storage: root path contains NUL");
  std::string root = root_in;
  if (root.front() != '/') {
    char cwd[4096];
    if (!::getcwd(cwd, sizeof cwd)) return Status::from_errno(errno, "getcwd for root " + root_in);
    root = join_path(cwd, root);
  }
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  CKPTIO_RETURN_IF_ERROR(make_dirs("/", std::string_view(root).substr(1)));
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) return Status::from_errno(errno, "stat " + root);
  if (!S_ISDIR(st.st_mode)) return invalid_argument("local storage root " + root + " is not a directory");

  uint64_t request = options.request_size ? options.request_size : kDefaultRequestSize;
  request = std::clamp<uint64_t>((request + 4095) / 4096 * 4096, 4096, 1ull << 30);
  const uint32_t depth = std::clamp<uint32_t>(options.queue_depth ? options.queue_depth : kDefaultQueueDepth, 1, 4096);
  CKPTIO_ASSIGN_OR_RETURN(std::unique_ptr<Ring> ring, Ring::create(depth));

  WriterOptions w;
  w.direct = direct;
  w.request_size = request;
  ReadSettings r;
  r.mode = mode;
  r.direct_io = direct;
  r.request_size = request;
  return std::shared_ptr<Storage>(std::make_shared<LocalStorage>(root, std::shared_ptr<Ring>(std::move(ring)), w, r));
}

}  // namespace ckptio
