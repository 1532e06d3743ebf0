#include "src/save/prepare_index.h"

#include <exception>
#include <new>
#include <utility>

#include "ckptio/index.h"
#include "src/save/build_index.h"
#include "src/save/commit.h"
#include "src/util/allocate.h"
#include "src/util/async.h"
#include "src/util/clock.h"

namespace ckptio {

IndexPreparer::IndexPreparer(Storage& storage, const SaveJob& job, const std::vector<uint32_t>& crcs)
    : storage_(storage), job_(job), crcs_(crcs) {
  prepared_ = try_async("ckptio-prepare", [this] { prepare(); });
}

IndexPreparer::~IndexPreparer() {
  checksums_known(false);  // (a no-op once told) the thread must not wait forever
}

void IndexPreparer::checksums_known(bool ok) {
  if (std::exchange(told_, true)) return;
  checksums_known_.set_value(ok);
}

Status IndexPreparer::verdict() {
  if (!prepared_.valid()) {  // no thread for it: prepared now, on this one
    prepared_ = std::async(std::launch::deferred, [this] { prepare(); });
    prepared_.wait();
  }
  // (Also when the writes failed: nothing may still be staging.) What the
  // preparation threw (out of memory) fails this save, not the worker.
  try {
    return verdict_.get();
  } catch (...) {
    return status_of_exception("prepare the index");
  }
}

void IndexPreparer::prepare() {
  bool said = false;
  auto say = [&](Status st) {
    said = true;
    verdict_promise_.set_value(std::move(st));
  };
  try {
    BuiltIndex b = build_index(job_);
    if (!known_.get()) return say(internal_error("index not needed: the data writes failed"));
    for (size_t k = 0; k < crcs_.size(); ++k) *b.crc_of[k] = crcs_[k];
    b.index.committed_unix_ns = unix_ns_now();
    json_ = serialize_index(b.index);
    if (json_.empty()) return say(out_of_memory("serialize the index"));  // (serialize_index's failure)
    auto stage = [&] { return stage_index(storage_, job_.paths, json_); };
    std::future<Status> staging;  // (object stores stage nothing: the index PUT is the commit)
    if (job_.paths.renames) staging = try_async("ckptio-stage", stage);
    auto check = parse_index(json_);
    Status staged = staging.valid() ? staging.get() : stage();
    if (!check.ok() && check.status().code() == Code::kResourceExhausted) return say(check.status());
    if (!check.ok()) return say(check.status().annotate("internal: serialized index fails to parse"));
    say(staged);
  } catch (...) {  // (out of memory) the worker must not wait for a verdict that never comes
    if (!said) verdict_promise_.set_exception(std::current_exception());
  }
}

}  // namespace ckptio
