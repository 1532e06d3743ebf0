// The read executor (contract in read_executor.h).
#include "src/restore/read_executor.h"

#include <algorithm>
#include <deque>
#include <future>
#include <memory>
#include <new>

#include "src/util/async.h"

namespace ckptio {
namespace {

constexpr size_t kBatchesInFlight = 2;  // == the number of staging arenas

// The smallest pos >= cursor with pos == offset modulo align (a power of two).
uint64_t place(uint64_t cursor, uint64_t offset, uint64_t align) {
  return cursor + ((offset - cursor) & (align - 1));
}

struct InFlight {
  size_t begin = 0, end = 0;           // reads [begin, end)
  std::vector<std::byte*> landing;     // per read of the batch
  std::vector<ReadRequest> reqs;       // per read of length > 0, in order
  std::vector<size_t> req_read;        // the read of each request
  std::unique_ptr<std::byte[]> fillers;
  std::future<Status> done;
};

class Executor {
 public:
  Executor(Storage& storage, std::span<const std::string> keys, std::vector<ExecRead>* reads,
           ReadConsumer& consumer, const ReadExecutorLimits& limits, const std::string& what,
           ReadExecutorStats* stats)
      : storage_(storage), keys_(keys), reads_(*reads), consumer_(consumer), limits_(limits), what_(what),
        stats_(stats ? stats : &own_stats_), align_(std::max<uint64_t>(limits.align, 1)) {}

  Status run() {
    Status first;
    try {
      first = loop();
    } catch (const std::bad_alloc&) {
      // (Destinations, staging, a consumer's leaves: the memory of a restore
      // is taken as it goes, so the system may refuse it midway.)
      first = out_of_memory(what_);
    }
    for (InFlight& f : reading_)
      if (f.done.valid()) (void)f.done.get();  // never leave a read writing into freed memory
    return first;
  }

 private:
  Status loop() {
    Status first = plan_more();
    while (first.ok()) {
      while (reading_.size() < kBatchesInFlight && cut_ < reads_.size()) launch();
      // Plan ahead while fewer than two batches wait to be launched (in
      // bytes, and in batch ends a consumer marked).
      if (more_ && planned_bytes_ - launched_bytes_ < 2 * limits_.batch_bytes && unlaunched_ends_ < 2) {
        first = plan_more();  // while the reads are in flight
        continue;
      }
      if (reading_.empty()) break;  // all planned, read and delivered
      InFlight f = std::move(reading_.front());
      reading_.pop_front();
      first = finish(f);
    }
    return first;
  }

  Status plan_more() {
    const size_t before = reads_.size();
    auto more = consumer_.more(&reads_);
    if (!more.ok()) return more.status();
    more_ = *more;
    for (size_t i = before; i < reads_.size(); ++i) {
      if (!reads_[i].filler) planned_bytes_ += reads_[i].length;
      if (reads_[i].ends_batch) ++unlaunched_ends_;
    }
    return Status::OK();
  }

  // Cuts the next batch from reads_[cut_, ...) and starts reading it.
  void launch() {
    Buffer& arena = arenas_[launches_++ % kBatchesInFlight];
    InFlight f;
    f.begin = cut_;
    uint64_t bytes = 0, staged = 0, filler_bytes = 0;
    std::vector<uint64_t> at;  // staging offset (staged reads) or filler offset
    size_t i = cut_;
    for (; i < reads_.size(); ++i) {
      ExecRead& r = reads_[i];
      // The byte limit before destination(), which may take memory (a
      // buffer of a bounded pool) that only a delivered batch gives back.
      if (i > f.begin && !r.filler && bytes + r.length > limits_.batch_bytes) break;
      if (i >= resolved_) {
        if (!r.filler && !r.dst) r.dst = consumer_.destination(i);
        resolved_ = i + 1;
      }
      const bool stage = !r.filler && !r.dst && r.length > 0;
      const uint64_t pos = stage ? place(staged, r.offset, align_) : 0;
      if (i > f.begin && stage && pos + r.length > limits_.staging_bytes) break;
      if (r.filler) {
        at.push_back(filler_bytes);
        filler_bytes += r.length;
      } else {
        at.push_back(pos);
        if (stage) staged = pos + r.length;
        bytes += r.length;
      }
      if (r.ends_batch) {
        --unlaunched_ends_;
        ++i;
        break;
      }
    }
    f.end = cut_ = i;
    launched_bytes_ += bytes;
    if (staged > arena.size()) arena = Buffer::allocate(staged, std::max<uint64_t>(align_, 64));
    if (filler_bytes > 0) f.fillers.reset(new std::byte[filler_bytes]);
    f.landing.resize(f.end - f.begin);
    for (size_t k = f.begin; k < f.end; ++k) {
      const ExecRead& r = reads_[k];
      std::byte*& land = f.landing[k - f.begin];
      land = r.filler ? f.fillers.get() + at[k - f.begin] : r.dst ? r.dst : arena.data() + at[k - f.begin];
      if (r.length == 0) continue;
      f.reqs.push_back(ReadRequest{keys_[r.file], r.offset, r.length, land});
      f.req_read.push_back(k);
      stats_->bytes_read += r.length;
    }
    stats_->requests += f.reqs.size();
    ++stats_->batches;
    // (The span stays valid as f moves into reading_: a vector's elements
    // move with it.)
    f.done = async_or_deferred([&storage = storage_, reqs = std::span<const ReadRequest>(f.reqs)] {
      return storage.read(reqs);
    });
    reading_.push_back(std::move(f));
  }

  // Delivers a landed batch, or reads a failed one again read by read.
  Status finish(InFlight& f) {
    Status st = f.done.get();
    for (size_t k = f.begin; k < f.end; ++k)
      if (!reads_[k].filler) delivered_bytes_ += reads_[k].length;
    if (st.ok()) {
      for (size_t k = f.begin; k < f.end; ++k) {
        if (reads_[k].filler) continue;
        CKPTIO_RETURN_IF_ERROR(consumer_.landed(k, f.landing[k - f.begin]));
      }
      consumer_.delivered(f.end, delivered_bytes_);
      return Status::OK();
    }
    bool any_failed = false;
    size_t q = 0;  // the next request
    for (size_t k = f.begin; k < f.end; ++k) {
      const bool has_req = q < f.req_read.size() && f.req_read[q] == k;
      const ReadRequest* req = has_req ? &f.reqs[q++] : nullptr;
      if (reads_[k].filler) continue;
      Status one = req ? storage_.read(std::span<const ReadRequest>(req, 1)) : Status::OK();
      if (one.ok()) {
        CKPTIO_RETURN_IF_ERROR(consumer_.landed(k, f.landing[k - f.begin]));
        continue;
      }
      any_failed = true;
      CKPTIO_RETURN_IF_ERROR(consumer_.failed(k, std::move(one)));
    }
    if (!any_failed) return st.annotate(what_);
    consumer_.delivered(f.end, delivered_bytes_);
    return Status::OK();
  }

  Storage& storage_;
  std::span<const std::string> keys_;
  std::vector<ExecRead>& reads_;
  ReadConsumer& consumer_;
  const ReadExecutorLimits limits_;
  const std::string& what_;
  ReadExecutorStats own_stats_;
  ReadExecutorStats* stats_;
  const uint64_t align_;
  // Batch i lays its staged reads out in arena i % kBatchesInFlight: batch
  // i + 2 is launched only after batch i was delivered. (Declared before
  // reading_, which is drained before they are freed.)
  Buffer arenas_[kBatchesInFlight];
  std::deque<InFlight> reading_;
  size_t cut_ = 0;       // the first read not launched
  size_t resolved_ = 0;  // reads before it have had destination() asked
  size_t launches_ = 0;
  uint64_t planned_bytes_ = 0, launched_bytes_ = 0, delivered_bytes_ = 0;
  size_t unlaunched_ends_ = 0;  // ends_batch flags among reads not launched
  bool more_ = true;
};

}  // namespace

Status execute_reads(Storage& storage, std::span<const std::string> keys, std::vector<ExecRead>* reads,
                     ReadConsumer& consumer, const ReadExecutorLimits& limits, const std::string& what,
                     ReadExecutorStats* stats) {
  Executor e(storage, keys, reads, consumer, limits, what, stats);
  return e.run();
}

}  // namespace ckptio
