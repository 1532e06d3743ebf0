// Real file-system faults at every stage of a save, its commit, retention, gc
// and restore (issue 5). The local io_uring backend works on a small tmpfs the
// test mounts; at the exact moment a stage begins (the fault-injecting
// wrapper's hook, which injects nothing itself) the test
//   - fills the file system to the last block (ENOSPC), or
//   - makes every directory of the checkpoint read-only (EACCES),
// and the real kernel answers the operation. Whatever a stage does then, the
// promise holds: the save either commits whole or fails with the file
// system's error naming the path; the previous steps stay committed and
// restore bit-exact; once the file system is healed, gc() leaves exactly the
// committed steps and the next save succeeds. Restores, verify and discovery
// are checked on a full and on a read-only file system (they must work), and
// on unreadable files (they must fail, naming the file, never falling back
// silently to an older step).
//
// Root ignores mode bits, so as root the scenarios run in a forked child that
// has dropped to the unprivileged user 65534 (nobody): the EACCES are genuine.
// Mounting needs CAP_SYS_ADMIN; without it the test skips with the reason (CI
// runs as root).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "backends/local/local_storage.h"
#include "backends/fault/fault_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"
#include "testutil/fork_safety.h"
#include "testutil/random_bytes.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uid_t kNobody = 65534;

enum class Harm { kFull, kReadOnly };

const char* harm_name(Harm h) { return h == Harm::kFull ? "full file system" : "read-only directories"; }
Code harm_code(Harm h) { return h == Harm::kFull ? Code::kNoSpace : Code::kPermissionDenied; }
const char* harm_errno_text(Harm h) {
  return h == Harm::kFull ? std::strerror(ENOSPC) : std::strerror(EACCES);
}

// A save's stages as the storage seam sees them (src/save/commit.cc, the POSIX
// protocol): `op` on a key containing `key_part`. `must_fail[h]`: the stage
// cannot succeed under harm h (a full tmpfs still lets fsync, rename and
// unlink through; read-only directories still let open files be written).
struct Stage {
  const char* name;
  FaultOp op;
  const char* key_part;
  bool must_fail_full;
  bool must_fail_readonly;
  bool after_commit;  // retention: the step is committed before the stage
};

const Stage kSaveStages[] = {
    {"create the first data file", FaultOp::kCreate, ".tmp-", true, true, false},
    {"write data", FaultOp::kWrite, ".tmp-", true, true, false},
    {"fsync a data file", FaultOp::kFinish, ".tmp-", false, true, false},
    {"write the index", FaultOp::kPut, "ckptio_index.json", true, true, false},
    {"fsync the stage directory", FaultOp::kSync, ".tmp-", false, true, false},
    {"rename the stage to the step", FaultOp::kRename, ".tmp-", false, true, false},
    {"retention: rename the oldest step away", FaultOp::kRename, "run-1/", false, true, true},
    {"retention: remove the renamed step", FaultOp::kRemove, ".del-", false, true, true},
};

struct OwnedLeaf {
  std::string path;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};

std::vector<OwnedLeaf> make_state(uint64_t seed) {
  std::vector<OwnedLeaf> s;
  s.push_back({"params.w", DType::kFloat32, {256, 1024}, testutil::random_bytes(kMiB, seed)});
  s.push_back({"params.b", DType::kInt32, {1000}, testutil::random_bytes(4000, seed + 1)});
  s.push_back({"opt.count", DType::kInt64, {}, testutil::random_bytes(8, seed + 2)});
  return s;
}

std::vector<LeafView> views(const std::vector<OwnedLeaf>& state) {
  std::vector<LeafView> v;
  for (const auto& l : state) v.push_back(LeafView::full("model", l.path, l.dtype, l.shape, l.bytes.data()));
  return v;
}

void expect_restores(CheckpointManager& m, std::optional<int64_t> step, const std::vector<OwnedLeaf>& want,
                     const std::string& where) {
  auto r = m.restore(step);
  ASSERT_TRUE(r.ok()) << where << ": " << r.status().to_string();
  if (step) EXPECT_EQ(r->step, *step) << where;
  ASSERT_EQ(r->leaves.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(r->leaves[i].data.size(), want[i].bytes.size()) << where << ": " << want[i].path;
    EXPECT_EQ(std::memcmp(r->leaves[i].data.data(), want[i].bytes.data(), want[i].bytes.size()), 0)
        << where << ": " << want[i].path;
  }
}

// The checkpoint at <mount>/ckpt on the tmpfs at <mount>, and the harms.
class Scenario {
 public:
  explicit Scenario(std::string mount) : mount_(std::move(mount)), root_(mount_ + "/ckpt") {}

  // A fresh checkpoint directory and manager (retention keeps 2 steps).
  void reset() {
    manager_.reset();
    heal();
    std::error_code ec;
    fs::remove_all(root_, ec);
    auto local = make_local_storage(root_);
    ASSERT_TRUE(local.ok()) << local.status().to_string();
    faults_ = make_fault_storage(*local);
    ManagerOptions options;
    options.max_to_keep = 2;
    options.chunk_size = 256 * 1024;  // several writes per data file
    manager_ = std::make_unique<CheckpointManager>(faults_, options);
  }

  // Harm `h` the first time `op` reaches a key containing `key_part`.
  void harm_at(FaultOp op, std::string key_part, Harm h) {
    auto fired = std::make_shared<std::atomic<bool>>(false);
    fired_ = fired;
    faults_->set_hook([this, op, key_part, h, fired](FaultOp o, const std::string& key) {
      if (o != op || key.find(key_part) == std::string::npos) return;
      if (fired->exchange(true)) return;
      harm(h);
    });
  }
  bool harm_fired() const { return fired_ && *fired_; }
  void no_hook() { faults_->set_hook(nullptr); }

  void harm(Harm h) {
    if (h == Harm::kFull) fill();
    else set_dirs_writable(false);
  }
  void heal() {
    set_dirs_writable(true);
    std::error_code ec;
    fs::remove(mount_ + "/filler", ec);
  }

  CheckpointManager& m() { return *manager_; }
  FaultStorage& faults() { return *faults_; }
  const std::string& root() const { return root_; }
  void close() { manager_.reset(); }

  // Every directory name under the checkpoint's root.
  std::vector<std::string> dir_names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) names.push_back(e.path().filename().string());
    return names;
  }

 private:
  // Writes a filler file until the file system has no block left.
  void fill() {
    int fd = ::open((mount_ + "/filler").c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    std::vector<char> buf(kMiB, 'f');
    int err = 0;
    for (size_t chunk : {size_t{kMiB}, size_t{4096}, size_t{1}}) {
      ssize_t n;
      while ((n = ::write(fd, buf.data(), chunk)) > 0) {}  // short writes go on
      err = n < 0 ? errno : 0;
      if (err != ENOSPC) break;
    }
    ::close(fd);  // before asserting: an open unlinked filler would keep its space
    ASSERT_EQ(err, ENOSPC) << std::strerror(err);
  }
  void set_dirs_writable(bool writable) {
    std::error_code ec;
    if (!fs::exists(root_, ec)) return;
    std::vector<fs::path> dirs{root_};
    for (auto it = fs::recursive_directory_iterator(root_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_directory()) dirs.push_back(it->path());
    for (const auto& d : dirs) ::chmod(d.c_str(), writable ? 0755 : 0555);
  }

  std::string mount_, root_;
  std::shared_ptr<FaultStorage> faults_;
  std::unique_ptr<CheckpointManager> manager_;
  std::shared_ptr<std::atomic<bool>> fired_;
};

void expect_error_names_the_file_system(const Status& st, Harm h, const std::string& root,
                                        const std::string& where) {
  EXPECT_EQ(st.code(), harm_code(h)) << where << ": " << st.to_string();
  EXPECT_NE(st.message().find(root), std::string::npos) << where << ": no path in " << st.to_string();
  EXPECT_NE(st.message().find(harm_errno_text(h)), std::string::npos)
      << where << ": no errno text in " << st.to_string();
}

// Steps 1 and 2 are committed; step 3's save meets `h` at `stage`.
void save_stage(Scenario& s, const Stage& stage, Harm h) {
  const std::string where = std::string(stage.name) + " on a " + harm_name(h);
  SCOPED_TRACE(where);
  ASSERT_NO_FATAL_FAILURE(s.reset());
  auto s1 = make_state(1), s2 = make_state(2), s3 = make_state(3);
  ASSERT_TRUE(s.m().save(1, views(s1)).value().wait().ok());
  ASSERT_TRUE(s.m().save(2, views(s2)).value().wait().ok());

  s.harm_at(stage.op, stage.key_part, h);
  auto handle = s.m().save(3, views(s3));
  Status st = handle.ok() ? handle->wait() : handle.status();
  (void)s.m().wait_until_finished();  // retention runs after the handle completes
  s.no_hook();
  ASSERT_TRUE(s.harm_fired()) << "the stage was never reached";
  const bool must_fail = h == Harm::kFull ? stage.must_fail_full : stage.must_fail_readonly;
  if (stage.after_commit) {
    // Retention runs after the commit: the save succeeded, and a retention
    // failure is a warning, never a lost step.
    EXPECT_TRUE(st.ok()) << st.to_string();
  } else if (must_fail) {
    EXPECT_FALSE(st.ok()) << "the save succeeded";
  }
  if (!st.ok()) expect_error_names_the_file_system(st, h, s.root(), where);
  std::printf("  %-40s %-22s save %s\n", stage.name, harm_name(h),
              st.ok() ? "committed" : st.to_string().c_str());

  // Still harmed: discovery and restore work, and report what is committed.
  auto latest = s.m().latest_step();
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  const int64_t want_latest = st.ok() ? 3 : 2;
  EXPECT_EQ(latest->value_or(-1), want_latest);
  ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), std::nullopt, st.ok() ? s3 : s2, where + ", harmed"));
  ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), 2, s2, where + ", harmed"));
  EXPECT_TRUE(s.m().verify(2).ok());

  // Healed: gc leaves only committed steps, which all restore; saving goes on.
  s.heal();
  Status gc = s.m().gc();
  EXPECT_TRUE(gc.ok()) << gc.to_string();
  auto steps = s.m().all_steps();
  ASSERT_TRUE(steps.ok()) << steps.status().to_string();
  for (const std::string& name : s.dir_names())
    EXPECT_TRUE(name.find(".tmp-") == std::string::npos && name.find(".del-") == std::string::npos)
        << name << " left after gc";
  EXPECT_EQ(s.dir_names().size(), steps->size()) << "directories that are not committed steps";
  EXPECT_EQ(steps->back(), want_latest);
  if (stage.after_commit || !st.ok()) EXPECT_NE(std::find(steps->begin(), steps->end(), 2), steps->end());
  for (int64_t step : *steps)
    ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), step, step == 1 ? s1 : step == 2 ? s2 : s3,
                                            where + ", healed, step " + std::to_string(step)));
  auto s4 = make_state(4);
  Status next = s.m().save(4, views(s4)).value().wait();
  EXPECT_TRUE(next.ok()) << next.to_string();
  ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), std::nullopt, s4, where + ", next save"));
}

// gc itself on a harmed file system, with a dead attempt to remove.
void gc_stage(Scenario& s, Harm h) {
  const std::string where = std::string("gc on a ") + harm_name(h);
  SCOPED_TRACE(where);
  ASSERT_NO_FATAL_FAILURE(s.reset());
  auto s1 = make_state(1), s2 = make_state(2);
  ASSERT_TRUE(s.m().save(1, views(s1)).value().wait().ok());
  // A save that fails and cannot clean up after itself (what a kill leaves).
  s.faults().add_rule(FaultRule{.op = FaultOp::kPut, .code = Code::kIOError, .message = "injected"});
  s.faults().add_rule(FaultRule{.op = FaultOp::kRemove, .code = Code::kIOError, .message = "injected"});
  EXPECT_FALSE(s.m().save(2, views(s2)).value().wait().ok());
  (void)s.m().wait_until_finished();  // the attempt is no longer in flight
  s.faults().clear_rules();
  ASSERT_EQ(s.dir_names().size(), 2u) << "the failed attempt's stage directory";

  s.harm_at(FaultOp::kRemove, ".tmp-", h);
  Status gc = s.m().gc();
  s.no_hook();
  ASSERT_TRUE(s.harm_fired());
  if (h == Harm::kReadOnly) {
    EXPECT_FALSE(gc.ok());
    expect_error_names_the_file_system(gc, h, s.root(), where);
  } else {
    EXPECT_TRUE(gc.ok()) << gc.to_string();  // unlinking needs no space
  }
  std::printf("  %-40s %-22s gc %s\n", "gc removes a dead attempt", harm_name(h),
              gc.ok() ? "ok" : gc.to_string().c_str());
  ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), std::nullopt, s1, where));
  s.heal();
  EXPECT_TRUE(s.m().gc().ok());
  EXPECT_EQ(s.dir_names(), std::vector<std::string>{"run-1"});
}

// Reading on a harmed file system works; unreadable files are errors that
// name them (permission is not damage: no silent fallback to older steps).
void restore_stages(Scenario& s) {
  for (Harm h : {Harm::kFull, Harm::kReadOnly}) {
    SCOPED_TRACE(std::string("restore on a ") + harm_name(h));
    ASSERT_NO_FATAL_FAILURE(s.reset());
    auto s1 = make_state(1), s2 = make_state(2);
    ASSERT_TRUE(s.m().save(1, views(s1)).value().wait().ok());
    ASSERT_TRUE(s.m().save(2, views(s2)).value().wait().ok());
    s.harm(h);
    auto steps = s.m().all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    EXPECT_EQ(*steps, (std::vector<int64_t>{1, 2}));
    ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), std::nullopt, s2, "latest"));
    ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), 1, s1, "step 1"));
    EXPECT_TRUE(s.m().verify(1).ok());
    EXPECT_TRUE(s.m().verify(2).ok());
    std::printf("  %-40s %-22s restore ok\n", "restore, verify, discovery", harm_name(h));
    s.heal();
  }

  ASSERT_NO_FATAL_FAILURE(s.reset());
  auto s1 = make_state(1), s2 = make_state(2);
  ASSERT_TRUE(s.m().save(1, views(s1)).value().wait().ok());
  ASSERT_TRUE(s.m().save(2, views(s2)).value().wait().ok());
  auto index = s.m().read_index(2);
  ASSERT_TRUE(index.ok());
  ASSERT_FALSE(index->files.empty());
  const std::string data = s.root() + "/run-2/" + index->files[0].name;
  ASSERT_EQ(::chmod(data.c_str(), 0), 0) << data;
  for (std::optional<int64_t> step : {std::optional<int64_t>(2), std::optional<int64_t>()}) {
    auto r = s.m().restore(step);
    ASSERT_FALSE(r.ok()) << "restored from an unreadable data file";
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    EXPECT_NE(r.status().message().find(data), std::string::npos) << r.status().to_string();
  }
  Status v = s.m().verify(2);
  EXPECT_EQ(v.code(), Code::kPermissionDenied) << v.to_string();
  EXPECT_NE(v.message().find(data), std::string::npos) << v.to_string();
  std::printf("  %-40s %-22s %s\n", "restore an unreadable data file", "mode 000", v.to_string().c_str());
  ASSERT_EQ(::chmod(data.c_str(), 0644), 0);

  const std::string index_file = s.root() + "/run-2/ckptio_index.json";
  ASSERT_EQ(::chmod(index_file.c_str(), 0), 0);
  auto latest = s.m().latest_step();
  ASSERT_FALSE(latest.ok()) << "an unreadable index was skipped as if the step were not there";
  EXPECT_EQ(latest.status().code(), Code::kPermissionDenied) << latest.status().to_string();
  EXPECT_NE(latest.status().message().find(index_file), std::string::npos) << latest.status().to_string();
  std::printf("  %-40s %-22s %s\n", "discover with an unreadable index", "mode 000",
              latest.status().to_string().c_str());
  ASSERT_EQ(::chmod(index_file.c_str(), 0644), 0);
  ASSERT_NO_FATAL_FAILURE(expect_restores(s.m(), std::nullopt, s2, "readable again"));
}

void run_scenarios(const std::string& mount) {
  Scenario s(mount);
  for (const Stage& stage : kSaveStages)
    for (Harm h : {Harm::kFull, Harm::kReadOnly}) ASSERT_NO_FATAL_FAILURE(save_stage(s, stage, h));
  for (Harm h : {Harm::kFull, Harm::kReadOnly}) ASSERT_NO_FATAL_FAILURE(gc_stage(s, h));
  ASSERT_NO_FATAL_FAILURE(restore_stages(s));
  s.close();
}

TEST(FsFault, FullAndReadOnlyFileSystemAtEveryStage) {
  const fs::path dir = fs::temp_directory_path() / ("ckptio-fsfault-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string mount = (dir / "fs").string();
  fs::create_directories(mount);
  if (::mount("tmpfs", mount.c_str(), "tmpfs", 0, "size=8m,mode=0755") != 0) {
    const std::string why = std::strerror(errno);
    fs::remove_all(dir);
    GTEST_SKIP() << "cannot mount an 8 MiB tmpfs at " << mount << " (" << why
                 << "): the file-system fault test needs CAP_SYS_ADMIN";
  }
  struct Unmount {
    std::string mount;
    fs::path dir;
    ~Unmount() {
      ::umount2(mount.c_str(), MNT_DETACH);
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } unmount{mount, dir};

  if (::geteuid() != 0) {  // mode bits already apply to us
    run_scenarios(mount);
    return;
  }
  // Root: run as nobody in a child so that read-only directories refuse.
  ASSERT_EQ(::chown(mount.c_str(), kNobody, kNobody), 0) << std::strerror(errno);
  if (!testutil::under_thread_sanitizer()) {
    auto others = testutil::other_threads_after();
    ASSERT_TRUE(others.empty()) << "must fork single-threaded; also running: " << others.front();
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
      std::fprintf(stderr, "cannot drop to uid %u: %s\n", kNobody, std::strerror(errno));
      std::_Exit(3);
    }
    run_scenarios(mount);
    std::fflush(nullptr);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child (uid 65534) died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child (uid 65534) found the failures printed above";
}

}  // namespace
}  // namespace ckptio
