// The saver and the checker of the power-cut suite (tests/powercut/run).
//
// The harness runs this program against a file system whose device it clones
// at chosen moments (a power cut); see the comment at the top of
// tests/powercut/run for the whole picture.
//
//   powercut_driver save  BASE [options]   saves steps, reports on stdout
//   powercut_driver check BASE [options]   checks a crash state (a clone)
//
// What is saved is a pure function of (step, generation): every leaf's bytes
// come from splitmix64 of a seed made of the two, and the generation goes
// into the step's metadata ({"gen": G}), so a checker can tell which version
// of a step (an overwrite saves a new generation) it found and compare every
// byte.
//
// save reports, one line each, written with one write(2) at the moment it
// happens:
//   ACK <step> <gen>       a save handle (or a copy) reported the step committed
//   AT <point> <key>       the saver reached a commit stage (--hooks); it then
//                          waits for a line on stdin before going on
//   DONE                   every step saved
// The stage points come from a forwarding Storage around the real local
// backend (opened through open_storage, as a user opens it):
//   before:/after: data-fsync     WritableObject::finish of a data file
//                  index-put      put of <stage>/ckptio_index.json
//                  manifest-put   put of a multi-process manifest
//                  stage-sync     sync(<stage>/)
//                  rename         rename(<stage>/, <step>/) no replace
//                  exchange       rename(...) RENAME_EXCHANGE (overwrite)
//                  del-rename     rename(<step>/, <step>.del-…/) (retention)
//                  parent-sync    sync("")
//                  remove         remove_prefix (retention, overwrite, gc)
//
// --bug makes the wrapper break the protocol, to prove the suite sees it:
//   no-parent-sync  rename() done here with renameat2 and no fsync of the
//                   parent, and sync("") a no-op
//   no-data-sync    data files written here with buffered pwrite and never
//                   fsynced (finish() only truncates and closes)
//   no-stage-sync   sync(<stage>/) a no-op
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckptio/ckptio.h"
#include "tests/testutil/forwarding_storage.h"

namespace ckptio {
namespace {

// ---- Output: one write(2) per line, so lines of several processes never mix.
void say(const std::string& line) {
  std::string s = line + "\n";
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    ssize_t w = ::write(1, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);  // the harness is gone
    p += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void die(const std::string& what) {
  say("FAIL " + what);
  std::fflush(nullptr);
  _exit(1);
}

// ---- Deterministic content ------------------------------------------------
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill(std::byte* dst, size_t n, int64_t step, int gen, int leaf, uint64_t from = 0) {
  const uint64_t seed = splitmix(static_cast<uint64_t>(step) * 1000003u + static_cast<uint64_t>(gen) * 7919u + leaf);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t at = from + i;
    const uint64_t w = splitmix(seed ^ (at / 8));
    dst[i] = static_cast<std::byte>(w >> (8 * (at % 8)));
  }
}

struct LeafDef {
  std::string prefix, path;
  DType dtype;
  Shape shape;
};

// The leaves of a step: one large (row-split in a group save), two small.
std::vector<LeafDef> leaf_defs(uint64_t bytes, int processes) {
  int64_t rows = static_cast<int64_t>(bytes / 1024);
  rows = std::max<int64_t>(processes, rows - rows % processes);
  return {{"params", "w", DType::kFloat32, {rows, 256}},
          {"params", "b", DType::kFloat32, {100}},
          {"opt", "m", DType::kUInt8, {static_cast<int64_t>(bytes / 4) + 123}}};
}

uint64_t leaf_bytes(const LeafDef& d) {
  uint64_t n = dtype_size(d.dtype);
  for (int64_t x : d.shape) n *= static_cast<uint64_t>(x);
  return n;
}

std::string gen_metadata(int gen) { return "{\"gen\": " + std::to_string(gen) + "}"; }

std::optional<int> parse_gen(const std::string& meta) {
  const size_t at = meta.find("\"gen\"");
  if (at == std::string::npos) return std::nullopt;
  const size_t colon = meta.find(':', at);
  if (colon == std::string::npos) return std::nullopt;
  return std::atoi(meta.c_str() + colon + 1);
}

// ---- The stage hooks ---------------------------------------------------------
struct Hooks {
  bool enabled = false;
  std::mutex mu;  // one stage at a time: the harness answers them in order

  void at(const std::string& point, const std::string& key) {
    if (!enabled) return;
    std::lock_guard<std::mutex> lock(mu);
    say("AT " + point + " " + (key.empty() ? "." : key));
    std::string reply;
    char c;
    for (;;) {
      ssize_t r = ::read(0, &c, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) _exit(3);  // the harness is gone
      if (c == '\n') break;
      reply += c;
    }
    if (reply != "go") die("unexpected reply from the harness: " + reply);
  }
};

enum class Bug { kNone, kNoParentSync, kNoDataSync, kNoStageSync };

std::string trim_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

class HookedWriter final : public WritableObject {
 public:
  HookedWriter(std::unique_ptr<WritableObject> inner, Hooks* hooks, std::string key)
      : inner_(std::move(inner)), hooks_(hooks), key_(std::move(key)) {}
  uint64_t granularity() const override { return inner_->granularity(); }
  uint64_t alignment() const override { return inner_->alignment(); }
  void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
    inner_->write_async(offset, data, std::move(done));
  }
  Status finish(uint64_t final_size) override {
    hooks_->at("before:data-fsync", key_);
    Status st = inner_->finish(final_size);
    hooks_->at("after:data-fsync", key_);
    return st;
  }
  void abort() override { inner_->abort(); }

 private:
  std::unique_ptr<WritableObject> inner_;
  Hooks* hooks_;
  std::string key_;
};

// --bug no-data-sync: buffered writes, no fsync, written under the final name.
class UnsyncedWriter final : public WritableObject {
 public:
  UnsyncedWriter(int fd, std::string path, Hooks* hooks, std::string key)
      : fd_(fd), path_(std::move(path)), hooks_(hooks), key_(std::move(key)) {}
  ~UnsyncedWriter() override {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t granularity() const override { return 1; }
  uint64_t alignment() const override { return 1; }
  void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
    size_t at = 0;
    while (at < data.size()) {
      ssize_t w = ::pwrite(fd_, data.data() + at, data.size() - at, static_cast<off_t>(offset + at));
      if (w < 0) {
        done(Status::from_errno(errno, "pwrite " + path_));
        return;
      }
      at += static_cast<size_t>(w);
    }
    done(Status::OK());
  }
  Status finish(uint64_t final_size) override {
    hooks_->at("before:data-fsync", key_);
    // Trim only when the last range was padded: xfs starts writeback at
    // close after a truncate down (its guard against zero-length files),
    // which would hide the missing fsync.
    Status st = Status::OK();
    struct stat sb {};
    if (::fstat(fd_, &sb) != 0) st = Status::from_errno(errno, "fstat " + path_);
    if (st.ok() && static_cast<uint64_t>(sb.st_size) != final_size &&
        ::ftruncate(fd_, static_cast<off_t>(final_size)) != 0)
      st = Status::from_errno(errno, "ftruncate " + path_);
    ::close(fd_);
    fd_ = -1;
    hooks_->at("after:data-fsync", key_);
    return st;
  }
  void abort() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
  }

 private:
  int fd_;
  std::string path_;
  Hooks* hooks_;
  std::string key_;
};

// Forwards every call to the real backend, announcing the commit's stages.
class HookedStorage final : public testutil::ForwardingStorage {
 public:
  HookedStorage(std::shared_ptr<Storage> inner, std::string root, Hooks* hooks, Bug bug)
      : ForwardingStorage(std::move(inner)), root_(std::move(root)), hooks_(hooks), bug_(bug) {}

  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    return wrap(key, inner_->create(key, size_hint));
  }
  Result<std::unique_ptr<WritableObject>> create_new(const std::string& key, uint64_t size_hint) override {
    if (bug_ == Bug::kNoDataSync) {
      const std::string path = root_ + "/" + key;
      const std::string dir = path.substr(0, path.rfind('/'));
          for (size_t i = 1; i <= dir.size(); ++i)
        if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0755);
      int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return Status::from_errno(errno, "create " + path);
      return std::unique_ptr<WritableObject>(new UnsyncedWriter(fd, path, hooks_, key));
    }
    return wrap(key, inner_->create_new(key, size_hint));
  }
  Status put(const std::string& key, std::span<const std::byte> data) override {
    const std::string p = put_point(key);
    hooks_->at("before:" + p, key);
    Status st = inner_->put(key, data);
    hooks_->at("after:" + p, key);
    return st;
  }
  Status put_new(const std::string& key, std::span<const std::byte> data) override {
    const std::string p = put_point(key);
    hooks_->at("before:" + p, key);
    Status st = inner_->put_new(key, data);
    hooks_->at("after:" + p, key);
    return st;
  }
  Status remove_prefix(const std::string& prefix) override {
    hooks_->at("before:remove", prefix);
    Status st = inner_->remove_prefix(prefix);
    hooks_->at("after:remove", prefix);
    return st;
  }
  Status rename(const std::string& from, const std::string& to, RenameMode mode) override {
    const std::string p = mode == RenameMode::kExchange ? "exchange"
                          : to.find(".del-") != std::string::npos ? "del-rename"
                                                                    : "rename";
    hooks_->at("before:" + p, from + ">" + to);
    Status st = bug_ == Bug::kNoParentSync ? unsynced_rename(from, to, mode) : inner_->rename(from, to, mode);
    hooks_->at("after:" + p, from + ">" + to);
    return st;
  }
  Status sync(const std::string& prefix) override {
    const std::string p = prefix.empty() ? "parent-sync" : "stage-sync";
    hooks_->at("before:" + p, prefix);
    Status st = Status::OK();
    const bool skip = (bug_ == Bug::kNoParentSync && prefix.empty()) || (bug_ == Bug::kNoStageSync && !prefix.empty());
    if (!skip) st = inner_->sync(prefix);
    hooks_->at("after:" + p, prefix);
    return st;
  }

 private:
  static std::string put_point(const std::string& key) {
    if (key.ends_with("ckptio_index.json")) return "index-put";
    if (key.find("manifest") != std::string::npos) return "manifest-put";
    return "put";
  }
  Result<std::unique_ptr<WritableObject>> wrap(const std::string& key, Result<std::unique_ptr<WritableObject>> w) {
    if (!w.ok()) return w;
    return std::unique_ptr<WritableObject>(new HookedWriter(std::move(*w), hooks_, key));
  }
  Status unsynced_rename(const std::string& from, const std::string& to, RenameMode mode) {
    const std::string a = root_ + "/" + trim_slash(from), b = root_ + "/" + trim_slash(to);
    const unsigned flags = mode == RenameMode::kExchange ? RENAME_EXCHANGE : RENAME_NOREPLACE;
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), flags) != 0)
      return Status::from_errno(errno, "rename " + a + " to " + b);
    return Status::OK();
  }

  std::string root_;
  Hooks* hooks_;
  Bug bug_;
};

// ---- Options -------------------------------------------------------------------
struct Options {
  std::string mode, base;
  int64_t first = 1;
  int steps = 10;
  uint64_t bytes = 1 << 20;
  StagingMode staging = StagingMode::kCopy;
  int overwrite_every = 0;  // every Nth save overwrites the latest step
  int keep = 0;
  bool hooks = false;
  Bug bug = Bug::kNone;
  int processes = 1;        // group commit
  std::string cp_from;      // cp: the source base (steps are saved there first)
  bool gc_thread = false;   // a concurrent gc(min_age) and dead leftovers
  bool probe_sync = false;  // Storage::sync itself, not a commit (see run_probe_sync)
  std::vector<std::pair<int64_t, int>> acked;  // check: acknowledged (step, gen)
  std::string run_id = "pc";
};

Options parse(int argc, char** argv) {
  if (argc < 3) die("usage: powercut_driver save|check BASE [options]");
  Options o;
  o.mode = argv[1];
  o.base = argv[2];
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--first") o.first = std::atoll(val().c_str());
    else if (a == "--steps") o.steps = std::atoi(val().c_str());
    else if (a == "--bytes") o.bytes = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--staging") o.staging = val() == "borrow" ? StagingMode::kBorrow : StagingMode::kCopy;
    else if (a == "--overwrite-every") o.overwrite_every = std::atoi(val().c_str());
    else if (a == "--keep") o.keep = std::atoi(val().c_str());
    else if (a == "--hooks") o.hooks = true;
    else if (a == "--processes") o.processes = std::atoi(val().c_str());
    else if (a == "--cp-from") o.cp_from = val();
    else if (a == "--gc-thread") o.gc_thread = true;
    else if (a == "--probe-sync") o.probe_sync = true;
    else if (a == "--run-id") o.run_id = val();
    else if (a == "--bug") {
      const std::string b = val();
      o.bug = b == "no-parent-sync" ? Bug::kNoParentSync
              : b == "no-data-sync" ? Bug::kNoDataSync
              : b == "no-stage-sync" ? Bug::kNoStageSync
              : b == "none"          ? Bug::kNone
                                     : (die("unknown --bug " + b), Bug::kNone);
    } else if (a == "--acked") {
      // step:gen,step:gen,...
      std::string s = val();
      size_t at = 0;
      while (at < s.size()) {
        size_t comma = s.find(',', at);
        if (comma == std::string::npos) comma = s.size();
        std::string item = s.substr(at, comma - at);
        size_t colon = item.find(':');
        if (colon == std::string::npos) die("--acked wants step:gen, got " + item);
        o.acked.emplace_back(std::atoll(item.c_str()), std::atoi(item.c_str() + colon + 1));
        at = comma + 1;
      }
    } else {
      die("unknown option " + a);
    }
  }
  return o;
}

// The whole leaves of (step, gen), owned.
struct OwnedState {
  std::vector<LeafDef> defs;
  std::vector<std::vector<std::byte>> bytes;
};

OwnedState make_state(const Options& o, int64_t step, int gen) {
  OwnedState s;
  s.defs = leaf_defs(o.bytes, o.processes);
  for (size_t i = 0; i < s.defs.size(); ++i) {
    s.bytes.emplace_back(leaf_bytes(s.defs[i]));
    fill(s.bytes.back().data(), s.bytes.back().size(), step, gen, static_cast<int>(i));
  }
  return s;
}

// The leaves process `p` of `n` saves: every leaf whole when n == 1; else
// the large leaf's rows in n bands, the small ones by process 0.
std::vector<LeafView> views_of(const OwnedState& s, int p, int n) {
  std::vector<LeafView> v;
  for (size_t i = 0; i < s.defs.size(); ++i) {
    const LeafDef& d = s.defs[i];
    if (n == 1) {
      v.push_back(LeafView::full(d.prefix, d.path, d.dtype, d.shape, s.bytes[i].data()));
      continue;
    }
    if (i == 0) {
      const int64_t rows = d.shape[0] / n;
      LeafView lv{d.prefix, d.path, d.dtype, d.shape, {}};
      Box box{{rows * p, 0}, {rows * (p + 1), d.shape[1]}};
      lv.shards.push_back({box, s.bytes[i].data() + static_cast<size_t>(rows * p) * d.shape[1] * 4});
      v.push_back(std::move(lv));
    } else if (p == 0) {
      v.push_back(LeafView::full(d.prefix, d.path, d.dtype, d.shape, s.bytes[i].data()));
    }
  }
  return v;
}

std::shared_ptr<Storage> open_base(const std::string& base) {
  auto st = open_storage(base);
  if (!st.ok()) die("open " + base + ": " + st.status().to_string());
  return *st;
}

// Dead leftovers for gc to remove while saves run: a temporary step
// directory whose times are two hours old.
void plant_leftover(const std::string& base, int64_t step, int n) {
  // (An attempt id as ckptio makes them, 16 hex digits: gc leaves any other
  // suffix alone.)
  char attempt[17];
  std::snprintf(attempt, sizeof attempt, "00000000dead%04x", static_cast<unsigned>(n) & 0xffffu);
  const std::string dir = base + "/run-" + std::to_string(step) + ".tmp-" + attempt;
  ::mkdir(dir.c_str(), 0755);
  const std::string f = dir + "/data-dead-0.bin";
  int fd = ::open(f.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die("create " + f + ": " + std::strerror(errno));
  std::vector<char> junk(64 << 10, 'x');
  if (::write(fd, junk.data(), junk.size()) < 0) die("write " + f);
  ::fsync(fd);
  ::close(fd);
  const struct timespec old[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ::utimensat(AT_FDCWD, f.c_str(), old, 0);
  ::utimensat(AT_FDCWD, dir.c_str(), old, 0);
}

// ---- save -----------------------------------------------------------------------
int run_save_process(const Options& o, int p, int n, Hooks* hooks) {
  auto real = open_base(o.base);
  auto storage = std::make_shared<HookedStorage>(real, o.base, hooks, o.bug);
  ManagerOptions mo;
  mo.staging = o.staging;
  mo.max_to_keep = o.keep;
  mo.staging_budget = 64ull << 20;
  mo.chunk_size = 256 << 10;
  if (n > 1) {
    mo.processes.index = p;
    mo.processes.count = n;
    mo.processes.run_id = o.run_id;
    mo.processes.timeout_seconds = 120;
    mo.processes.poll_seconds = 0.01;
  }
  CheckpointManager m(storage, mo);

  std::atomic<bool> stop{false};
  std::thread gc;
  if (o.gc_thread && p == 0) {
    gc = std::thread([&] {
      ManagerOptions go;
      CheckpointManager g(real, go);  // another "process": unhooked, old leftovers only
      int planted = 0;
      while (!stop.load()) {
        plant_leftover(o.base, o.first + planted, planted);
        ++planted;
        Status st = g.gc({.min_age_seconds = 600});
        if (!st.ok()) die("gc beside the saver: " + st.to_string());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  std::map<int64_t, int> gens;  // committed here: step -> generation
  int64_t next = o.first;
  for (int i = 0; i < o.steps; ++i) {
    int64_t step = next;
    int gen = 0;
    bool overwrite = false;
    if (o.overwrite_every > 0 && i % o.overwrite_every == o.overwrite_every - 1 && !gens.empty()) {
      step = gens.rbegin()->first;
      gen = gens.rbegin()->second + 1;
      overwrite = true;
    } else {
      ++next;
    }
    OwnedState s = make_state(o, step, gen);
    SaveOptions so;
    so.metadata_json = gen_metadata(gen);
    so.overwrite = overwrite;
    auto h = m.save(step, views_of(s, p, n), so);
    if (!h.ok()) die("save " + std::to_string(step) + ": " + h.status().to_string());
    Status st = h->wait();
    if (!st.ok()) die("save " + std::to_string(step) + " (process " + std::to_string(p) + "): " + st.to_string());
    if (p == 0) say("ACK " + std::to_string(step) + " " + std::to_string(gen));
    gens[step] = gen;
  }
  stop = true;
  if (gc.joinable()) gc.join();
  return 0;
}

// Storage::sync on its own (what StorageConformanceTest.SyncSucceedsOnExisting
// Directories cannot see): write probe-<i>/a/b.bin with the real backend
// (create, write, finish: fsync of the file, rename into a/), then sync the
// directory through the hooked storage, and acknowledge the object once sync
// returned. The harness cuts right after each sync: an object acknowledged
// must be there, whole. With sync a no-op the rename into a/ is not durable
// until the journal commits on its own.
int run_probe_sync(const Options& o, Hooks* hooks) {
  auto real = open_base(o.base);
  HookedStorage hooked(real, o.base, hooks, o.bug);
  for (int i = 0; i < o.steps; ++i) {
    const std::string key = "probe-" + std::to_string(i) + "/a/b.bin";
    std::vector<std::byte> bytes(static_cast<size_t>(o.bytes / 4 + 4096));
    fill(bytes.data(), bytes.size(), i, 0, 99);
    auto w = real->create(key, bytes.size());
    if (!w.ok()) die("create " + key + ": " + w.status().to_string());
    const uint64_t g = (*w)->alignment();
    const size_t padded = (bytes.size() + g - 1) / g * g;
    void* mem = std::aligned_alloc(4096, (padded + 4095) / 4096 * 4096);
    std::memset(mem, 0, padded);
    std::memcpy(mem, bytes.data(), bytes.size());
    std::mutex mu;
    Status wrote;
    (*w)->write_async(0, {static_cast<const std::byte*>(mem), padded}, [&](Status st) {
      std::lock_guard<std::mutex> l(mu);
      wrote = st;
    });
    Status st = (*w)->finish(bytes.size());
    std::free(mem);
    if (!st.ok() || !wrote.ok()) die("write " + key + ": " + st.to_string() + " " + wrote.to_string());
    st = hooked.sync("probe-" + std::to_string(i) + "/a/");
    if (!st.ok()) die("sync: " + st.to_string());
    say("ACK " + std::to_string(i) + " 0");
    hooks->at("acked", key);  // the harness cuts here, knowing the ACK
  }
  say("DONE");
  return 0;
}

int check_probe_sync(const Options& o) {
  for (auto [i, gen] : o.acked) {
    const std::string path = o.base + "/probe-" + std::to_string(i) + "/a/b.bin";
    std::vector<std::byte> want(static_cast<size_t>(o.bytes / 4 + 4096));
    fill(want.data(), want.size(), i, 0, 99);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("object " + path + ", acknowledged after sync() of its directory, is missing after the power cut");
    std::vector<std::byte> got(want.size() + 1);
    ssize_t n = ::pread(fd, got.data(), got.size(), 0);
    ::close(fd);
    if (n != static_cast<ssize_t>(want.size()) || std::memcmp(got.data(), want.data(), want.size()) != 0)
      die("object " + path + " differs from what was written (" + std::to_string(n) + " bytes)");
  }
  say("CHECK OK probes=" + std::to_string(o.acked.size()));
  return 0;
}

int run_save(const Options& o) {
  Hooks hooks;
  hooks.enabled = o.hooks;
  if (o.probe_sync) return run_probe_sync(o, &hooks);
  if (!o.cp_from.empty()) {
    // cp: each step is saved at the source (not hooked, not on the file
    // system under test), then copied into BASE through the hooked storage;
    // only the copy's commit is acknowledged.
    auto srcs = open_base(o.cp_from);
    auto dst = std::make_shared<HookedStorage>(open_base(o.base), o.base, &hooks, o.bug);
    ManagerOptions mo;
    mo.staging_budget = 64ull << 20;
    CheckpointManager m(srcs, mo);
    for (int i = 0; i < o.steps; ++i) {
      const int64_t step = o.first + i;
      OwnedState s = make_state(o, step, 0);
      SaveOptions so;
      so.metadata_json = gen_metadata(0);
      auto h = m.save(step, views_of(s, 0, 1), so);
      if (!h.ok()) die("save " + std::to_string(step) + " at the cp source: " + h.status().to_string());
      Status st = h->wait();
      if (!st.ok()) die("save " + std::to_string(step) + " at the cp source: " + st.to_string());
      CopyOptions co;
      co.chunk_size = 256 << 10;
      auto r = copy_step(*srcs, *dst, step, co);
      if (!r.ok()) die("cp " + std::to_string(step) + ": " + r.status().to_string());
      say("ACK " + std::to_string(step) + " 0");
      // Keep the source small: the copy is what is tested.
      if (step - 2 >= o.first) (void)m.remove_step(step - 2);
    }
    say("DONE");
    return 0;
  }
  if (o.processes <= 1) {
    int rc = run_save_process(o, 0, 1, &hooks);
    say("DONE");
    return rc;
  }
  // A group: process 0 (the coordinator, which commits) is this one's child
  // too; only it pauses at stages and acknowledges.
  std::vector<pid_t> pids;
  for (int p = 0; p < o.processes; ++p) {
    pid_t pid = ::fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      Hooks mine;
      mine.enabled = o.hooks && p == 0;
      _exit(run_save_process(o, p, o.processes, &mine));
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed) die(std::to_string(failed) + " process(es) of the group failed");
  say("DONE");
  return 0;
}

// ---- check ------------------------------------------------------------------------
struct StepFiles {
  std::string index;
  std::map<std::string, uint64_t> files;  // name -> size, all under the step dir
};

std::map<int64_t, StepFiles> snapshot(Storage& s, const std::vector<int64_t>& steps) {
  std::map<int64_t, StepFiles> out;
  for (int64_t step : steps) {
    const std::string dir = "run-" + std::to_string(step);
    auto idx = s.get(dir + "/ckptio_index.json", 1ull << 30);
    if (!idx.ok()) die("read the index of step " + std::to_string(step) + ": " + idx.status().to_string());
    out[step].index = *idx;
    auto l = s.list(dir + "/", false);
    if (!l.ok()) die("list " + dir + ": " + l.status().to_string());
    for (auto& e : l->objects) out[step].files[e.key] = e.size;
  }
  return out;
}

int run_check(const Options& o) {
  if (o.probe_sync) return check_probe_sync(o);
  auto storage = open_base(o.base);
  ManagerOptions mo;
  mo.strict = true;  // damage is an error, never skipped silently
  CheckpointManager m(storage, mo);
  auto steps = m.all_steps();
  if (!steps.ok()) die("discovery: " + steps.status().to_string());
  auto dirs = m.list_step_dirs();
  if (!dirs.ok()) die("list step dirs: " + dirs.status().to_string());
  int leftovers = 0;
  for (auto& d : *dirs)
    if (!d.committed) ++leftovers;

  std::map<int64_t, int> found;  // step -> generation
  for (int64_t step : *steps) {
    auto r = m.restore(step);
    if (!r.ok()) die("listed step " + std::to_string(step) + " does not restore: " + r.status().to_string());
    auto gen = parse_gen(r->metadata_json);
    if (!gen) die("step " + std::to_string(step) + ": metadata without gen: " + r->metadata_json);
    const auto defs = leaf_defs(o.bytes, o.processes);
    if (r->leaves.size() != defs.size())
      die("step " + std::to_string(step) + ": " + std::to_string(r->leaves.size()) + " leaves, expected " +
          std::to_string(defs.size()));
    for (size_t i = 0; i < defs.size(); ++i) {
      const Tensor* t = nullptr;
      for (auto& l : r->leaves)
        if (l.prefix == defs[i].prefix && l.path == defs[i].path) t = &l;
      if (!t) die("step " + std::to_string(step) + ": leaf " + defs[i].prefix + "/" + defs[i].path + " missing");
      std::vector<std::byte> want(leaf_bytes(defs[i]));
      fill(want.data(), want.size(), step, *gen, static_cast<int>(i));
      if (t->data.size() != want.size() || std::memcmp(t->data.data(), want.data(), want.size()) != 0) {
        size_t at = 0;
        while (at < std::min(want.size(), t->data.size()) && t->data.data()[at] == want[at]) ++at;
        die("step " + std::to_string(step) + " gen " + std::to_string(*gen) + ": leaf " + defs[i].prefix + "/" +
            defs[i].path + " differs from what was saved, first at byte " + std::to_string(at) + " of " +
            std::to_string(want.size()));
      }
    }
    Status v = m.verify(step);
    if (!v.ok()) die("verify step " + std::to_string(step) + ": " + v.to_string());
    found[step] = *gen;
  }

  // Every acknowledged commit is there (or a newer generation of it), unless
  // retention removed it, which it may only when `keep` newer steps are there.
  for (auto [step, gen] : o.acked) {
    auto it = found.find(step);
    if (it == found.end()) {
      int newer = 0;
      for (auto& [s, g] : found)
        if (s > step) ++newer;
      if (o.keep > 0 && newer >= o.keep) continue;
      die("acknowledged step " + std::to_string(step) + " (gen " + std::to_string(gen) +
          ") is not committed after the power cut");
    }
    if (it->second < gen)
      die("acknowledged step " + std::to_string(step) + " gen " + std::to_string(gen) + " came back as the older gen " +
          std::to_string(it->second));
  }
  int64_t latest_acked = -1;
  for (auto& a : o.acked) latest_acked = std::max(latest_acked, a.first);
  const int64_t latest = found.empty() ? -1 : found.rbegin()->first;
  if (latest < latest_acked)
    die("the latest step is " + std::to_string(latest) + ", older than the last acknowledged " +
        std::to_string(latest_acked));

  // gc leaves only steps and changes none of them.
  const auto before = snapshot(*storage, *steps);
  Status g = m.gc();
  if (!g.ok()) die("gc: " + g.to_string());
  auto after_steps = m.all_steps();
  if (!after_steps.ok()) die("discovery after gc: " + after_steps.status().to_string());
  if (*after_steps != *steps) die("gc changed the committed steps");
  const auto after = snapshot(*storage, *after_steps);
  for (auto& [step, b] : before) {
    const StepFiles& a = after.at(step);
    if (a.index != b.index) die("gc changed the index of step " + std::to_string(step));
    // gc may remove unreferenced files from a step (a dead group save's
    // manifests), never one its index names.
    auto idx = m.read_index(step);
    if (!idx.ok()) die("index of step " + std::to_string(step) + " after gc: " + idx.status().to_string());
    for (auto& f : idx->files) {
      const std::string key = "run-" + std::to_string(step) + "/" + f.name;
      auto it = a.files.find(key);
      if (it == a.files.end() || it->second != f.size || b.files.at(key) != f.size)
        die("gc changed data file " + key + " of step " + std::to_string(step));
    }
  }
  auto root = storage->list("", true);
  if (!root.ok()) die("list the base: " + root.status().to_string());
  std::set<std::string> want;
  for (int64_t s : *steps) want.insert("run-" + std::to_string(s) + "/");
  for (auto& pfx : root->prefixes)
    if (!want.count(pfx)) die("gc left " + pfx + " behind");
  for (auto& obj : root->objects) die("gc left " + obj.key + " behind");
  if (!steps->empty()) {
    Status v = m.verify(steps->back());
    if (!v.ok()) die("verify the latest step after gc: " + v.to_string());
  }

  std::string list;
  for (auto& [s, gn] : found) list += (list.empty() ? "" : ",") + std::to_string(s) + ":" + std::to_string(gn);
  say("CHECK OK steps=" + (list.empty() ? std::string("-") : list) + " leftovers=" + std::to_string(leftovers));
  return 0;
}

}  // namespace
}  // namespace ckptio

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  const ckptio::Options o = ckptio::parse(argc, argv);
  if (o.mode == "save") return ckptio::run_save(o);
  if (o.mode == "check") return ckptio::run_check(o);
  ckptio::die("unknown mode " + o.mode);
}
