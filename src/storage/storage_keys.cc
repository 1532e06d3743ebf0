// The storage seam's key rules (include/ckptio/storage.h), shared by the
// memory and S3 backends; the local backend adds its temporary-file names.
// Also the default Storage::newest_change, Storage::open and Storage::put_new.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "ckptio/storage.h"

namespace ckptio {

namespace {

Status check_path(std::string_view s, bool is_prefix) {
  auto bad = [&](const char* why) {
    std::string printable;
    for (char c : s) printable += (c == '\0') ? std::string("\\0") : std::string(1, c);
    return invalid_argument(std::string(is_prefix ? "prefix '" : "key '") + printable + "': " + why);
  };
  if (s.empty()) return is_prefix ? Status::OK() : bad("empty");
  if (s.front() == '/') return bad("must be relative (leading '/')");
  if (s.find('\0') != std::string_view::npos) return bad("contains NUL");
  if (s.find('\\') != std::string_view::npos) return bad("contains a backslash");
  if (s.find("..") != std::string_view::npos) return bad("contains '..'");
  if (!is_prefix && s.back() == '/') return bad("ends with '/'");
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('/', start);
    std::string_view part = s.substr(start, end == std::string_view::npos ? end : end - start);
    if (end != std::string_view::npos || !is_prefix) {
      if (part.empty()) return bad("has an empty path component");
      if (part == ".") return bad("has a '.' path component");
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return Status::OK();
}

}  // namespace

Status check_storage_key(std::string_view key) { return check_path(key, false); }
Status check_storage_prefix(std::string_view prefix) { return check_path(prefix, true); }

namespace {

class InMemoryReader final : public ObjectReader {
 public:
  explicit InMemoryReader(std::string bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status read(uint64_t offset, uint64_t length, std::byte* dst) override {
    if (offset > bytes_.size() || length > bytes_.size() - offset)
      return data_loss("read " + name_ + " [" + std::to_string(offset) + ", +" + std::to_string(length) +
                       "): past its end at " + std::to_string(bytes_.size()));
    std::memcpy(dst, bytes_.data() + offset, length);
    return Status::OK();
  }
  std::optional<std::string_view> in_memory() const override { return bytes_; }

 private:
  const std::string bytes_;
  const std::string name_;
};

}  // namespace

Result<std::unique_ptr<ObjectReader>> Storage::open(const std::string& key, uint64_t max_size) {
  CKPTIO_ASSIGN_OR_RETURN(std::string bytes, get(key, max_size));
  return std::unique_ptr<ObjectReader>(std::make_unique<InMemoryReader>(std::move(bytes), describe() + "/" + key));
}

Status Storage::put_new(const std::string& key, std::span<const std::byte> data) {
  auto there = stat(key);
  if (there.ok()) return Status(Code::kAlreadyExists, describe() + "/" + key + " already exists");
  if (there.status().code() != Code::kNotFound) return there.status();
  return put(key, data);
}

Result<std::optional<int64_t>> Storage::newest_change(const std::string& prefix) {
  CKPTIO_ASSIGN_OR_RETURN(ListResult listed, list(prefix, /*delimiter=*/false));
  auto unfinished = list_unfinished(prefix);
  if (unfinished.status().code() == Code::kUnimplemented)  // the server cannot list them
    unfinished = std::vector<ListEntry>{};
  CKPTIO_RETURN_IF_ERROR(unfinished.status());
  std::optional<int64_t> newest;
  for (const auto* entries : {&listed.objects, &*unfinished})
    for (const ListEntry& e : *entries) newest = std::max(newest.value_or(e.modified_unix_ns), e.modified_unix_ns);
  return newest;
}

}  // namespace ckptio
