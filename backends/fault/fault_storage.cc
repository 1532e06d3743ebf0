// FaultStorage: forwards every call to a base Storage, failing calls that
// match a rule, and keeps the books needed to simulate a power cut.
//
// Durability model (the one ckptio's POSIX commit protocol relies on; modelled
// after RocksDB's FaultInjectionTestFS):
//   - Data. An object written through create()/finish() or put() has durable
//     data once finish() (fsync) or put() (write, fsync, rename, fsync of the
//     directory) returned OK. Ranges of a writer that never finished are lost.
//   - Names. A finished object's name is durable once sync() of the directory
//     holding it ("a/b/" for "a/b/c") returns OK after the finish. put() syncs
//     its own directory, so its name is durable at once. Only the entry in the
//     immediate directory is tracked: directories themselves are assumed to
//     exist durably once something was created in them (as RocksDB assumes).
//   - Renames. rename(from, to) of a prefix is durable on return by default,
//     matching the local backend, which fsyncs the parent inside rename().
//     With FaultStorageOptions::rename_durable_on_return = false it is durable
//     once sync() of the parent of `to` and of the parent of `from` returned
//     OK after it. A rename moves the pending (unsynced) names with it: an
//     unsynced file stays unsynced in the directory's new place.
//   - Removes (remove, remove_prefix) are durable on return. A real file
//     system could resurrect a removed file; ckptio never depends on a remove
//     for correctness, only for space, so the model keeps it simple.
//   - Object stores (a base without caps().atomic_rename) have no directories:
//     a finished upload is durable at once, and sync() is not needed.
//   - Objects the wrapper never saw written (they existed before it wrapped
//     `base`, or were written to `base` directly) are durable.
// drop_unsynced() applies the model: writers still open are aborted and fail
// from then on; every finished object whose name is not durable is removed
// from `base` (a durable older object it replaced is not brought back: the
// core never replaces data objects); non-durable renames are undone, newest
// first, by moving the keys back (base rename when it can, else copy).
//
// Locking: rules_mu_ guards the rules, the seeded generator and the hook;
// books_mu_ guards the durability books and is held across every call that
// changes names in `base` (finish, put, remove, rename, sync), so the books
// follow exactly the order in which `base` saw those calls. That serializes
// them, which is fine for a test tool. Lock order: books_mu_, then a writer's
// mu_. The hook runs with no lock held.
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <vector>

#include "backends/fault/fault_storage.h"

namespace ckptio {
namespace {

const char* op_name(FaultOp op) {
  switch (op) {
    case FaultOp::kCreate: return "create";
    case FaultOp::kWrite: return "write";
    case FaultOp::kFinish: return "finish";
    case FaultOp::kPut: return "put";
    case FaultOp::kGet: return "get";
    case FaultOp::kStat: return "stat";
    case FaultOp::kRead: return "read";
    case FaultOp::kList: return "list";
    case FaultOp::kRemove: return "remove";
    case FaultOp::kRename: return "rename";
    case FaultOp::kSync: return "sync";
  }
  return "?";
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// "a/b" and "a/b/" name the same directory; "" is the root.
std::string as_dir(const std::string& prefix) {
  if (prefix.empty() || prefix.back() == '/') return prefix;
  return prefix + "/";
}

// The directory holding `key`: "a/b/c" -> "a/b/", "c" -> "".
std::string dir_of(std::string_view key) {
  size_t slash = key.rfind('/');
  return slash == std::string_view::npos ? std::string() : std::string(key.substr(0, slash + 1));
}

// The directory holding a prefix: "a/b/" -> "a/", "b/" -> "".
std::string parent_of(const std::string& dir) {
  std::string_view d = dir;
  if (!d.empty() && d.back() == '/') d.remove_suffix(1);
  return dir_of(d);
}

class FaultWriter;

class FaultStorageImpl final : public FaultStorage,
                               public std::enable_shared_from_this<FaultStorageImpl> {
 public:
  FaultStorageImpl(std::shared_ptr<Storage> base, const FaultStorageOptions& options)
      : base_(std::move(base)), options_(options), rng_(kDefaultSeed) {}

  // Storage
  StorageCaps caps() const override { return base_->caps(); }
  std::string describe() const override { return "fault+" + base_->describe(); }
  uint64_t read_alignment() const override { return base_->read_alignment(); }
  uint64_t write_granularity() const override { return base_->write_granularity(); }
  uint64_t write_memory_alignment() const override { return base_->write_memory_alignment(); }
  uint64_t data_object_bytes() const override { return base_->data_object_bytes(); }
  Result<std::vector<ListEntry>> list_unfinished(const std::string& prefix) override {
    return base_->list_unfinished(prefix);
  }
  Result<std::optional<int64_t>> newest_change(const std::string& prefix) override {
    return base_->newest_change(prefix);
  }
  Status abort_unfinished(const std::string& key) override { return base_->abort_unfinished(key); }
  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override;
  Status put(const std::string& key, std::span<const std::byte> data) override;
  Status put_new(const std::string& key, std::span<const std::byte> data) override;
  Status put_either(const std::string& key, const std::function<Status()>& put);
  Result<std::string> get(const std::string& key, uint64_t max_size) override;
  Result<uint64_t> stat(const std::string& key) override;
  Status read(std::span<const ReadRequest> requests) override;
  Result<ListResult> list(const std::string& prefix, bool delimiter) override;
  Status remove(const std::string& key) override;
  Status remove_prefix(const std::string& prefix) override;
  Status rename(const std::string& from, const std::string& to, RenameMode mode) override;
  Status sync(const std::string& prefix) override;

  // FaultStorage
  void add_rule(const FaultRule& rule) override {
    std::lock_guard lock(rules_mu_);
    rules_.push_back({rule});
  }
  void clear_rules() override {
    std::lock_guard lock(rules_mu_);
    rules_.clear();
  }
  void set_seed(uint64_t seed) override {
    std::lock_guard lock(rules_mu_);
    rng_.seed(seed);
  }
  uint64_t faults_fired() const override { return fired_.load(); }
  void crash_after(uint64_t ops) override { crash_at_ = ops_seen_.load() + ops; }
  bool crashed() const override { return crashed_.load(); }
  Status drop_unsynced() override;
  void set_hook(std::function<void(FaultOp, const std::string&)> hook) override {
    auto h = hook ? std::make_shared<const Hook>(std::move(hook)) : nullptr;
    std::lock_guard lock(rules_mu_);
    hook_ = std::move(h);
  }

  // Runs the hook, then the rules: the injected error, or OK. For a rename,
  // `other` is `to`; a rule matches if either name contains its substring.
  Status before(FaultOp op, const std::string& key, const std::string* other = nullptr);
  // The rules with `after` set (checked once the operation took effect).
  Status fire(FaultOp op, const std::string& key, const std::string* other, bool after);

  // FaultWriter's side of the books.
  uint64_t register_writer(FaultWriter* w) {
    std::lock_guard lock(books_mu_);
    writers_[++last_writer_id_] = w;
    return last_writer_id_;
  }
  void forget_writer(uint64_t id) {
    std::lock_guard lock(books_mu_);
    writers_.erase(id);
  }
  // Runs `finish` (the base finish) under the books lock and records the result.
  Status finish_object(uint64_t id, const std::string& key, const std::function<Status()>& finish);

 private:
  using Hook = std::function<void(FaultOp, const std::string&)>;
  static constexpr uint64_t kDefaultSeed = 0x5eedf00d;

  struct RuleState {
    FaultRule rule;
    uint64_t matched = 0;  // matching calls seen
    uint64_t fired = 0;    // of which failed
  };

  struct PendingRename {
    std::string from, to;
    RenameMode mode;
    std::set<std::string> unsynced_dirs;  // parents still to be synced
  };

  // Moves every key under `src` to `dst` in base (undo of a rename).
  Status move_prefix(const std::string& src, const std::string& dst);
  Status undo_rename(const PendingRename& r);
  bool has_keys(const std::string& prefix, Status& first_error);
  void move_unsynced_names(const std::string& from, const std::string& to, RenameMode mode);

  const std::shared_ptr<Storage> base_;
  const FaultStorageOptions options_;
  std::atomic<uint64_t> fired_{0};
  std::atomic<uint64_t> ops_seen_{0};
  std::atomic<uint64_t> crash_at_{UINT64_MAX};
  std::atomic<bool> crashed_{false};

  mutable std::mutex rules_mu_;
  std::vector<RuleState> rules_;      // guarded by rules_mu_
  std::mt19937_64 rng_;               // guarded by rules_mu_
  std::shared_ptr<const Hook> hook_;  // guarded by rules_mu_

  std::mutex books_mu_;
  std::set<std::string> unsynced_names_;         // guarded by books_mu_
  std::vector<PendingRename> pending_renames_;   // oldest first; guarded by books_mu_
  std::map<uint64_t, FaultWriter*> writers_;     // live writers; guarded by books_mu_
  uint64_t last_writer_id_ = 0;                  // guarded by books_mu_
};

class FaultWriter final : public WritableObject {
 public:
  FaultWriter(std::shared_ptr<FaultStorageImpl> owner, std::unique_ptr<WritableObject> base,
              std::string key)
      : owner_(std::move(owner)), base_(std::move(base)), key_(std::move(key)),
        id_(owner_->register_writer(this)) {}

  ~FaultWriter() override {
    owner_->forget_writer(id_);  // first: drop_unsynced() must not see a dying writer
    abort();
  }

  uint64_t granularity() const override { return base_->granularity(); }
  uint64_t alignment() const override { return base_->alignment(); }

  void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
    Status st = owner_->before(FaultOp::kWrite, key_);
    {
      std::lock_guard lock(mu_);
      if (st.ok() && lost_) st = lost_status();
      if (!st.ok() && failed_.ok()) failed_ = st;  // finish() reports it too
    }
    if (!st.ok()) {
      done(std::move(st));
      return;
    }
    base_->write_async(offset, data, std::move(done));
  }

  Status finish(uint64_t final_size) override {
    Status injected = owner_->before(FaultOp::kFinish, key_);
    return owner_->finish_object(id_, key_, [&]() -> Status {
      Status earlier;
      {
        std::lock_guard lock(mu_);
        if (closed_) return Status(Code::kFailedPrecondition, key_ + ": finish() after finish() or abort()");
        closed_ = true;
        if (lost_) return lost_status();
        earlier = failed_;
      }
      if (!earlier.ok()) injected = earlier;
      // An injected fsync failure loses the object: nothing is published.
      if (!injected.ok()) {
        base_->abort();
        return injected;
      }
      return base_->finish(final_size);
    });
  }

  void cancel() noexcept override { base_->cancel(); }

  void abort() override {
    bool abort_base;
    {
      std::lock_guard lock(mu_);
      abort_base = !closed_ && !lost_;
      closed_ = true;
    }
    if (abort_base) base_->abort();
  }

  // The power went out: the object is gone and the writer is spent. Called by
  // drop_unsynced() under the books lock, with no call on this writer running.
  void lose() {
    std::lock_guard lock(mu_);
    if (closed_ || lost_) return;
    lost_ = true;
    base_->abort();
  }

 private:
  Status lost_status() const { return io_error(key_ + ": writer lost in a simulated power cut"); }

  const std::shared_ptr<FaultStorageImpl> owner_;
  const std::unique_ptr<WritableObject> base_;
  const std::string key_;
  const uint64_t id_;

  std::mutex mu_;
  Status failed_;        // first injected write fault; guarded by mu_
  bool closed_ = false;  // finish() or abort() was called; guarded by mu_
  bool lost_ = false;    // drop_unsynced() aborted the base writer; guarded by mu_
};

Status FaultStorageImpl::before(FaultOp op, const std::string& key, const std::string* other) {
  std::shared_ptr<const Hook> hook;
  {
    std::lock_guard lock(rules_mu_);
    hook = hook_;
  }
  if (hook) (*hook)(op, key);
  if (ops_seen_.fetch_add(1) >= crash_at_.load()) {
    crashed_ = true;
    return Status(Code::kIOError, std::string("simulated power cut (") + op_name(op) + " '" + key + "')");
  }
  return fire(op, key, other, false);
}

Status FaultStorageImpl::fire(FaultOp op, const std::string& key, const std::string* other, bool after) {
  std::lock_guard lock(rules_mu_);
  for (RuleState& r : rules_) {
    if (r.rule.op != op || r.rule.code == Code::kOk || r.rule.after != after) continue;
    const std::string& s = r.rule.key_substr;
    if (key.find(s) == std::string::npos && (!other || other->find(s) == std::string::npos)) continue;
    if (++r.matched <= r.rule.skip) continue;
    if (r.rule.times >= 0 && r.fired >= static_cast<uint64_t>(r.rule.times)) continue;
    if (r.rule.probability < 1.0) {
      // 53 random bits -> [0, 1): the same on every platform, unlike
      // std::uniform_real_distribution.
      double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
      if (!(u < r.rule.probability)) continue;
    }
    ++r.fired;
    fired_.fetch_add(1);
    std::string target = other ? key + " -> " + *other : key;
    return Status(r.rule.code, r.rule.message + " (" + op_name(op) + " '" + target + "')");
  }
  return Status::OK();
}

Result<std::unique_ptr<WritableObject>> FaultStorageImpl::create(const std::string& key,
                                                                 uint64_t size_hint) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kCreate, key));
  CKPTIO_ASSIGN_OR_RETURN(std::unique_ptr<WritableObject> w, base_->create(key, size_hint));
  return std::unique_ptr<WritableObject>(new FaultWriter(shared_from_this(), std::move(w), key));
}

Status FaultStorageImpl::finish_object(uint64_t id, const std::string& key,
                                       const std::function<Status()>& finish) {
  std::lock_guard lock(books_mu_);
  Status st = finish();
  writers_.erase(id);
  if (st.ok() && base_->caps().atomic_rename) unsynced_names_.insert(key);
  return st;
}

Status FaultStorageImpl::put(const std::string& key, std::span<const std::byte> data) {
  return put_either(key, [&] { return base_->put(key, data); });
}

Status FaultStorageImpl::put_new(const std::string& key, std::span<const std::byte> data) {
  return put_either(key, [&] { return base_->put_new(key, data); });  // a kPut rule fails it too
}

Status FaultStorageImpl::put_either(const std::string& key, const std::function<Status()>& put) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kPut, key));
  {
    std::lock_guard lock(books_mu_);
    Status st = put();
    if (!st.ok()) return st;
    unsynced_names_.erase(key);  // put syncs its directory
  }
  return fire(FaultOp::kPut, key, nullptr, /*after=*/true);
}

Result<std::string> FaultStorageImpl::get(const std::string& key, uint64_t max_size) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kGet, key));
  return base_->get(key, max_size);
}

Result<uint64_t> FaultStorageImpl::stat(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kStat, key));
  return base_->stat(key);
}

Status FaultStorageImpl::read(std::span<const ReadRequest> requests) {
  for (const ReadRequest& r : requests) CKPTIO_RETURN_IF_ERROR(before(FaultOp::kRead, r.key));
  return base_->read(requests);
}

Result<ListResult> FaultStorageImpl::list(const std::string& prefix, bool delimiter) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kList, prefix));
  return base_->list(prefix, delimiter);
}

Status FaultStorageImpl::remove(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kRemove, key));
  std::lock_guard lock(books_mu_);
  Status st = base_->remove(key);
  if (st.ok()) unsynced_names_.erase(key);
  return st;
}

Status FaultStorageImpl::remove_prefix(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kRemove, prefix));
  std::lock_guard lock(books_mu_);
  Status st = base_->remove_prefix(prefix);
  if (st.ok()) {
    auto it = unsynced_names_.lower_bound(prefix);
    while (it != unsynced_names_.end() && starts_with(*it, prefix)) it = unsynced_names_.erase(it);
  }
  return st;
}

void FaultStorageImpl::move_unsynced_names(const std::string& from, const std::string& to,
                                           RenameMode mode) {
  std::vector<std::string> from_names, to_names;
  for (auto it = unsynced_names_.lower_bound(from); it != unsynced_names_.end() && starts_with(*it, from);)
    from_names.push_back(*it), it = unsynced_names_.erase(it);
  if (mode == RenameMode::kExchange) {
    for (auto it = unsynced_names_.lower_bound(to); it != unsynced_names_.end() && starts_with(*it, to);)
      to_names.push_back(*it), it = unsynced_names_.erase(it);
  }
  for (const auto& n : from_names) unsynced_names_.insert(to + n.substr(from.size()));
  for (const auto& n : to_names) unsynced_names_.insert(from + n.substr(to.size()));
}

Status FaultStorageImpl::rename(const std::string& from, const std::string& to, RenameMode mode) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kRename, from, &to));
  std::lock_guard lock(books_mu_);
  Status st = base_->rename(from, to, mode);
  if (!st.ok()) return st;
  move_unsynced_names(from, to, mode);
  if (!options_.rename_durable_on_return)
    pending_renames_.push_back({from, to, mode, {parent_of(from), parent_of(to)}});
  return st;
}

Status FaultStorageImpl::sync(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(before(FaultOp::kSync, prefix));
  std::lock_guard lock(books_mu_);
  Status st = base_->sync(prefix);
  if (!st.ok()) return st;  // a failed fsync makes nothing durable
  const std::string dir = as_dir(prefix);
  for (auto it = unsynced_names_.lower_bound(dir); it != unsynced_names_.end() && starts_with(*it, dir);) {
    if (it->find('/', dir.size()) == std::string::npos) {
      it = unsynced_names_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = pending_renames_.begin(); it != pending_renames_.end();) {
    it->unsynced_dirs.erase(dir);
    it = it->unsynced_dirs.empty() ? pending_renames_.erase(it) : it + 1;
  }
  return st;
}

bool FaultStorageImpl::has_keys(const std::string& prefix, Status& first_error) {
  auto listed = base_->list(prefix, /*delimiter=*/false);
  if (!listed.ok()) {
    if (first_error.ok()) first_error = listed.status();
    return false;
  }
  return !listed->objects.empty();
}

Status FaultStorageImpl::move_prefix(const std::string& src, const std::string& dst) {
  CKPTIO_ASSIGN_OR_RETURN(ListResult listed, base_->list(src, /*delimiter=*/false));
  if (listed.objects.empty()) return Status::OK();
  if (base_->caps().atomic_rename && base_->rename(src, dst, RenameMode::kNoReplace).ok())
    return Status::OK();
  // `dst` is in the way (or base cannot rename): copy key by key.
  for (const ListEntry& e : listed.objects) {
    CKPTIO_ASSIGN_OR_RETURN(std::string bytes, base_->get(e.key, e.size));
    CKPTIO_RETURN_IF_ERROR(base_->put(dst + e.key.substr(src.size()),
                                      {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}));
  }
  return base_->remove_prefix(src);
}

Status FaultStorageImpl::undo_rename(const PendingRename& r) {
  if (r.mode == RenameMode::kNoReplace) return move_prefix(r.to, r.from);
  // Exchange: swap back. Either side may have lost all its keys just now.
  Status st;
  bool at_from = has_keys(r.from, st), at_to = has_keys(r.to, st);
  CKPTIO_RETURN_IF_ERROR(st);
  if (at_from && at_to) return base_->rename(r.to, r.from, RenameMode::kExchange);
  if (at_to) return move_prefix(r.to, r.from);
  if (at_from) return move_prefix(r.from, r.to);
  return Status::OK();
}

Status FaultStorageImpl::drop_unsynced() {
  std::lock_guard lock(books_mu_);
  Status first;
  auto note = [&](const Status& st) {
    if (!st.ok() && first.ok()) first = st;
  };
  for (auto& [id, w] : writers_) w->lose();
  writers_.clear();
  for (const std::string& key : unsynced_names_) note(base_->remove(key).annotate("drop_unsynced"));
  unsynced_names_.clear();
  for (auto it = pending_renames_.rbegin(); it != pending_renames_.rend(); ++it)
    note(undo_rename(*it).annotate("drop_unsynced: undo rename " + it->from + " -> " + it->to));
  pending_renames_.clear();
  return first;
}

}  // namespace

std::shared_ptr<FaultStorage> make_fault_storage(std::shared_ptr<Storage> base,
                                                 const FaultStorageOptions& options) {
  return std::make_shared<FaultStorageImpl>(std::move(base), options);
}

}  // namespace ckptio
