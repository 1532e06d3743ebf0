// A Storage that forwards every call to another one: the base of test
// wrappers that watch or alter a few calls (the kill torture's window
// reporter in crash_test.cc, the power-cut driver's stage hooks) and must
// pass the rest through unchanged, default methods included.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ckptio/storage.h"

namespace ckptio::testutil {

class ForwardingStorage : public Storage {
 public:
  explicit ForwardingStorage(std::shared_ptr<Storage> inner) : inner_(std::move(inner)) {}

  StorageCaps caps() const override { return inner_->caps(); }
  std::string describe() const override { return inner_->describe(); }
  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    return inner_->create(key, size_hint);
  }
  Result<std::unique_ptr<WritableObject>> create_new(const std::string& key, uint64_t size_hint) override {
    return inner_->create_new(key, size_hint);
  }
  Status put(const std::string& key, std::span<const std::byte> data) override { return inner_->put(key, data); }
  Status put_new(const std::string& key, std::span<const std::byte> data) override {
    return inner_->put_new(key, data);
  }
  Result<std::string> get(const std::string& key, uint64_t max_size) override { return inner_->get(key, max_size); }
  Result<uint64_t> stat(const std::string& key) override { return inner_->stat(key); }
  Result<std::unique_ptr<ObjectReader>> open(const std::string& key, uint64_t max_size) override {
    return inner_->open(key, max_size);
  }
  Status read(std::span<const ReadRequest> requests) override { return inner_->read(requests); }
  uint64_t write_granularity() const override { return inner_->write_granularity(); }
  uint64_t write_memory_alignment() const override { return inner_->write_memory_alignment(); }
  uint64_t data_object_bytes() const override { return inner_->data_object_bytes(); }
  uint64_t read_alignment() const override { return inner_->read_alignment(); }
  Result<ListResult> list(const std::string& prefix, bool delimiter) override {
    return inner_->list(prefix, delimiter);
  }
  Status remove(const std::string& key) override { return inner_->remove(key); }
  Status remove_prefix(const std::string& prefix) override { return inner_->remove_prefix(prefix); }
  Status rename(const std::string& from, const std::string& to, RenameMode mode) override {
    return inner_->rename(from, to, mode);
  }
  Result<std::vector<ListEntry>> list_unfinished(const std::string& prefix) override {
    return inner_->list_unfinished(prefix);
  }
  Result<std::optional<int64_t>> newest_change(const std::string& prefix) override {
    return inner_->newest_change(prefix);
  }
  Status abort_unfinished(const std::string& key) override { return inner_->abort_unfinished(key); }
  Status sync(const std::string& prefix) override { return inner_->sync(prefix); }

 protected:
  std::shared_ptr<Storage> inner_;
};

}  // namespace ckptio::testutil
