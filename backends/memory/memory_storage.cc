// The in-memory backend: a sorted map from key to immutable content, guarded
// by one mutex. Content is shared_ptr<const string>, so a reader copies the
// pointer under the lock and the bytes outside it; put() and finish() swap the
// pointer, which makes both atomic for readers (old or new, never a mix).
//
// Writers buffer their ranges privately and publish at finish(). Because the
// store is the reference the other backends are tested against, it checks the
// write contract strictly instead of papering over mistakes: overlapping
// ranges, holes and bytes past final_size are errors.
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "backends/memory/memory_storage.h"

namespace ckptio {
namespace {

Status check_key(std::string_view key) { return check_storage_key(key); }
Status check_prefix(std::string_view prefix) { return check_storage_prefix(prefix); }

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

using Content = std::shared_ptr<const std::string>;

int64_t unix_ns_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Stored {
  Content content;
  int64_t modified_unix_ns = 0;  // when it was published (kept by rename)
};

class MemoryStorage final : public Storage, public std::enable_shared_from_this<MemoryStorage> {
 public:
  MemoryStorage(bool posix_like, std::string name) : posix_like_(posix_like), name_(std::move(name)) {}

  StorageCaps caps() const override { return {posix_like_, posix_like_}; }
  std::string describe() const override { return "mem://" + name_; }

  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override;
  Status put(const std::string& key, std::span<const std::byte> data) override;
  Status put_new(const std::string& key, std::span<const std::byte> data) override;
  Result<std::string> get(const std::string& key, uint64_t max_size) override;
  Result<uint64_t> stat(const std::string& key) override;
  Status read(std::span<const ReadRequest> requests) override;
  Result<ListResult> list(const std::string& prefix, bool delimiter) override;
  Status remove(const std::string& key) override;
  Status remove_prefix(const std::string& prefix) override;
  Status rename(const std::string& from, const std::string& to, RenameMode mode) override;
  Status sync(const std::string& prefix) override { return check_prefix(prefix); }

  // Makes `content` visible at `key` (a writer's finish()).
  void publish(const std::string& key, Content content) {
    std::lock_guard lock(mu_);
    objects_[key] = Stored{std::move(content), unix_ns_now()};
  }

 private:
  // The content at `key`, or kNotFound naming it.
  Result<Content> lookup(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return not_found(describe() + "/" + key + ": no such object");
    return it->second.content;
  }

  const bool posix_like_;
  const std::string name_;

  mutable std::mutex mu_;
  std::map<std::string, Stored> objects_;  // guarded by mu_
};

// Buffers ranges until finish(). One thread at a time uses it (the contract);
// the mutex only makes a misuse show up as a clean error rather than a race.
class MemoryWriter final : public WritableObject {
 public:
  MemoryWriter(std::shared_ptr<MemoryStorage> store, std::string key)
      : store_(std::move(store)), key_(std::move(key)) {}

  uint64_t granularity() const override { return 1; }
  uint64_t alignment() const override { return 1; }

  // Runs `done` synchronously, before returning: nothing here can block.
  void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
    Status st = add_range(offset, data);
    done(std::move(st));
  }

  Status finish(uint64_t final_size) override;

  void abort() override {
    std::lock_guard lock(mu_);
    if (state_ == State::kOpen) state_ = State::kAborted;
    ranges_.clear();
  }

 private:
  enum class State { kOpen, kFinished, kAborted };

  Status add_range(uint64_t offset, std::span<const std::byte> data);
  std::string where() const { return store_->describe() + "/" + key_; }

  const std::shared_ptr<MemoryStorage> store_;
  const std::string key_;

  std::mutex mu_;
  State state_ = State::kOpen;                // guarded by mu_
  std::map<uint64_t, std::string> ranges_;    // offset -> bytes; guarded by mu_
  Status first_error_;                        // guarded by mu_
};

Status MemoryWriter::add_range(uint64_t offset, std::span<const std::byte> data) {
  std::lock_guard lock(mu_);
  if (state_ != State::kOpen)
    return Status(Code::kFailedPrecondition, where() + ": write after finish() or abort()");
  if (data.empty()) return Status::OK();
  Status st;
  const uint64_t end = offset + data.size();
  if (data.data() == nullptr) {
    st = invalid_argument(where() + ": write of " + std::to_string(data.size()) + " bytes from null");
  } else if (end < offset) {
    st = invalid_argument(where() + ": write range overflows");
  } else {
    auto next = ranges_.lower_bound(offset);
    bool overlaps = next != ranges_.end() && next->first < end;
    if (!overlaps && next != ranges_.begin()) {
      auto prev = std::prev(next);
      overlaps = prev->first + prev->second.size() > offset;
    }
    if (overlaps)
      st = invalid_argument(where() + ": write [" + std::to_string(offset) + ", " +
                            std::to_string(end) + ") overlaps an earlier write");
  }
  if (!st.ok()) {
    if (first_error_.ok()) first_error_ = st;
    return st;
  }
  ranges_.emplace(offset, std::string(reinterpret_cast<const char*>(data.data()), data.size()));
  return Status::OK();
}

Status MemoryWriter::finish(uint64_t final_size) {
  std::map<uint64_t, std::string> ranges;
  {
    std::lock_guard lock(mu_);
    if (state_ != State::kOpen)
      return Status(Code::kFailedPrecondition, where() + ": finish() after finish() or abort()");
    state_ = State::kFinished;  // whatever happens next, the writer is spent
    if (!first_error_.ok()) return first_error_;
    ranges.swap(ranges_);
  }
  // The ranges must tile [0, final_size) exactly: a hole or a byte past the end
  // means the core planned its writes wrongly.
  uint64_t pos = 0;
  for (const auto& [off, bytes] : ranges) {
    if (off != pos)
      return internal_error(where() + ": bytes [" + std::to_string(pos) + ", " + std::to_string(off) +
                            ") were never written (final size " + std::to_string(final_size) + ")");
    pos += bytes.size();
  }
  if (pos < final_size)
    return internal_error(where() + ": bytes [" + std::to_string(pos) + ", " +
                          std::to_string(final_size) + ") were never written");
  if (pos > final_size)
    return internal_error(where() + ": writes end at " + std::to_string(pos) + ", past final size " +
                          std::to_string(final_size));
  std::string content;
  if (ranges.size() == 1) {
    content = std::move(ranges.begin()->second);
  } else {
    content.reserve(final_size);
    for (auto& [off, bytes] : ranges) content += bytes;
  }
  store_->publish(key_, std::make_shared<const std::string>(std::move(content)));
  return Status::OK();
}

Result<std::unique_ptr<WritableObject>> MemoryStorage::create(const std::string& key, uint64_t) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  return std::unique_ptr<WritableObject>(new MemoryWriter(shared_from_this(), key));
}

Status MemoryStorage::put(const std::string& key, std::span<const std::byte> data) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  if (data.data() == nullptr && !data.empty()) return invalid_argument("put from null");
  publish(key, std::make_shared<const std::string>(reinterpret_cast<const char*>(data.data()),
                                                   data.size()));
  return Status::OK();
}

Status MemoryStorage::put_new(const std::string& key, std::span<const std::byte> data) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  if (data.data() == nullptr && !data.empty()) return invalid_argument("put from null");
  auto content = std::make_shared<const std::string>(reinterpret_cast<const char*>(data.data()), data.size());
  std::lock_guard lock(mu_);
  auto [it, fresh] = objects_.try_emplace(key, Stored{std::move(content), unix_ns_now()});
  if (!fresh) return Status(Code::kAlreadyExists, describe() + "/" + key + " already exists");
  return Status::OK();
}

Result<std::string> MemoryStorage::get(const std::string& key, uint64_t max_size) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  CKPTIO_ASSIGN_OR_RETURN(Content c, lookup(key));
  if (c->size() > max_size)
    return invalid_argument(describe() + "/" + key + ": " + std::to_string(c->size()) +
                            " bytes exceed the limit of " + std::to_string(max_size));
  return *c;
}

Result<uint64_t> MemoryStorage::stat(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  CKPTIO_ASSIGN_OR_RETURN(Content c, lookup(key));
  return static_cast<uint64_t>(c->size());
}

Status MemoryStorage::read(std::span<const ReadRequest> requests) {
  for (const ReadRequest& r : requests) {
    CKPTIO_RETURN_IF_ERROR(check_key(r.key));
    if (r.dst == nullptr && r.length > 0)
      return invalid_argument(describe() + "/" + r.key + ": read into null");
    CKPTIO_ASSIGN_OR_RETURN(Content c, lookup(r.key));
    const uint64_t end = r.offset + r.length;
    if (end < r.offset || end > c->size())
      return data_loss(describe() + "/" + r.key + ": read [" + std::to_string(r.offset) + ", " +
                       std::to_string(end) + ") past the end of a " + std::to_string(c->size()) +
                       "-byte object");
    if (r.length > 0) std::memcpy(r.dst, c->data() + r.offset, r.length);
  }
  return Status::OK();
}

Result<ListResult> MemoryStorage::list(const std::string& prefix, bool delimiter) {
  CKPTIO_RETURN_IF_ERROR(check_prefix(prefix));
  ListResult out;
  std::lock_guard lock(mu_);
  for (auto it = objects_.lower_bound(prefix); it != objects_.end() && starts_with(it->first, prefix);) {
    const std::string& key = it->first;
    size_t slash = delimiter ? key.find('/', prefix.size()) : std::string::npos;
    if (slash == std::string::npos) {
      out.objects.push_back({key, it->second.content->size(), it->second.modified_unix_ns});
      ++it;
      continue;
    }
    // Every key under the group sorts contiguously: report it once, skip the rest.
    std::string group = key.substr(0, slash + 1);
    out.prefixes.push_back(group);
    while (it != objects_.end() && starts_with(it->first, group)) ++it;
  }
  return out;
}

Status MemoryStorage::remove(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_key(key));
  std::lock_guard lock(mu_);
  objects_.erase(key);
  return Status::OK();
}

Status MemoryStorage::remove_prefix(const std::string& prefix) {
  CKPTIO_RETURN_IF_ERROR(check_prefix(prefix));
  std::lock_guard lock(mu_);
  auto first = objects_.lower_bound(prefix);
  auto last = first;
  while (last != objects_.end() && starts_with(last->first, prefix)) ++last;
  objects_.erase(first, last);
  return Status::OK();
}

Status MemoryStorage::rename(const std::string& from, const std::string& to, RenameMode mode) {
  if (!posix_like_) return Storage::rename(from, to, mode);
  for (const std::string* p : {&from, &to}) {
    CKPTIO_RETURN_IF_ERROR(check_prefix(*p));
    if (p->empty() || p->back() != '/')
      return invalid_argument(describe() + ": rename prefix '" + *p + "' must be non-empty and end in '/'");
  }
  if (starts_with(from, to) || starts_with(to, from))
    return invalid_argument(describe() + ": rename '" + from + "' -> '" + to + "': one contains the other");

  std::lock_guard lock(mu_);
  auto keys_under = [&](const std::string& p) {
    std::vector<std::string> keys;
    for (auto it = objects_.lower_bound(p); it != objects_.end() && starts_with(it->first, p); ++it)
      keys.push_back(it->first);
    return keys;
  };
  std::vector<std::string> from_keys = keys_under(from), to_keys = keys_under(to);
  if (from_keys.empty()) return not_found(describe() + "/" + from + ": nothing to rename");
  if (mode == RenameMode::kNoReplace && !to_keys.empty())
    return Status(Code::kAlreadyExists, describe() + "/" + to + " already exists");
  if (mode == RenameMode::kExchange && to_keys.empty())
    return not_found(describe() + "/" + to + ": nothing to exchange with");

  // Every new name, and room for every node, first: what throws there
  // (std::bad_alloc) changes nothing, so the rename stays all or nothing.
  // Then take every node out and re-insert it under its new name, so the
  // two sets never collide mid-way; none of that allocates (node handles
  // keep the contents in place, and the names are moved in).
  using Node = decltype(objects_)::node_type;
  std::vector<std::pair<const std::string*, std::string>> renames;
  renames.reserve(from_keys.size() + to_keys.size());
  for (const auto& k : from_keys) renames.emplace_back(&k, to + k.substr(from.size()));
  for (const auto& k : to_keys) renames.emplace_back(&k, from + k.substr(to.size()));
  std::vector<Node> moving;
  moving.reserve(renames.size());
  for (auto& [old_key, new_key] : renames) {
    moving.push_back(objects_.extract(*old_key));
    moving.back().key() = std::move(new_key);
  }
  for (Node& n : moving) objects_.insert(std::move(n));
  return Status::OK();
}

std::string anonymous_name() {
  static std::atomic<uint64_t> counter{0};
  return "anon-" + std::to_string(++counter);
}

}  // namespace

std::shared_ptr<Storage> make_memory_storage(bool posix_like) {
  return std::make_shared<MemoryStorage>(posix_like, anonymous_name());
}

std::shared_ptr<Storage> memory_storage_named(const std::string& name) {
  // Leaked on purpose: stores outlive static destruction, like a file system.
  static auto* mu = new std::mutex;
  static auto* stores = new std::map<std::string, std::shared_ptr<Storage>>;
  std::lock_guard lock(*mu);
  auto& slot = (*stores)[name];
  if (!slot) slot = std::make_shared<MemoryStorage>(/*posix_like=*/true, name);
  return slot;
}

}  // namespace ckptio
