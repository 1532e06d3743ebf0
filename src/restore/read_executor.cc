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
    f.done = async_or_deferred("ckptio-read", [&storage = storage_, reqs = std::span<const ReadRequest>(f.reqs)] {
      return storage.read(reqs);
    });
    reading_.push_back(std::move(f));
  }

  // Delivers a landed batch, or settles a failed one (settle()).
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
    Settling s{f};
    if (!f.reqs.empty()) {
      // A batch of one request is read again alone; a larger one is split.
      bool whole = false;
      CKPTIO_RETURN_IF_ERROR(settle(s, 0, f.reqs.size(), /*split=*/f.reqs.size() > 1, &whole));
    }
    CKPTIO_RETURN_IF_ERROR(hand_over(s, f.end));
    if (!s.any_failed) return st.annotate(what_);
    consumer_.delivered(f.end, delivered_bytes_);
    return Status::OK();
  }

  // A failed batch is narrowed by halving its requests: a span of them that
  // reads whole (one Storage::read: in parallel, and an object store merges
  // adjacent ranges into one GET) is delivered; a span that fails is split,
  // down to single requests, and a request that fails alone goes to
  // consumer.failed(). Spans are settled from the left, so the consumer sees
  // the reads in order and a restore stops at its first failed read. One
  // failure among n requests costs about 2 log2(n) reads, where reading them
  // one by one cost n (6,000 GETs in a row for a batch of small leaves).
  struct Settling {
    InFlight& f;
    size_t next;  // the first read not yet handed to the consumer
    bool any_failed = false;
    explicit Settling(InFlight& in) : f(in), next(in.begin) {}
  };

  // Settles requests [lo, hi) of s.f. `split`: the span is known to fail
  // (the span it halves failed, and the other half read whole), so it is
  // halved without being read whole first; a single request is always read
  // alone before it is called failed. *whole: the span read whole, in one.
  Status settle(Settling& s, size_t lo, size_t hi, bool split, bool* whole) {
    *whole = false;
    if (!split || hi - lo == 1) {
      Status st = storage_.read(std::span<const ReadRequest>(s.f.reqs).subspan(lo, hi - lo));
      if (st.ok()) {
        *whole = true;
        return hand_over(s, s.f.req_read[hi - 1] + 1);
      }
      if (hi - lo == 1) return fail(s, lo, std::move(st));
    }
    const size_t mid = lo + (hi - lo) / 2;
    bool left_whole = false, right_whole = false;
    CKPTIO_RETURN_IF_ERROR(settle(s, lo, mid, /*split=*/false, &left_whole));
    return settle(s, mid, hi, /*split=*/left_whole, &right_whole);
  }

  // Hands reads [s.next, end) to the consumer as landed (fillers skipped).
  Status hand_over(Settling& s, size_t end) {
    for (; s.next < end; ++s.next) {
      if (reads_[s.next].filler) continue;
      CKPTIO_RETURN_IF_ERROR(consumer_.landed(s.next, s.f.landing[s.next - s.f.begin]));
    }
    return Status::OK();
  }

  // Request q failed when read alone.
  Status fail(Settling& s, size_t q, Status st) {
    const size_t k = s.f.req_read[q];
    CKPTIO_RETURN_IF_ERROR(hand_over(s, k));
    s.next = k + 1;
    if (reads_[k].filler) return Status::OK();  // read only to join its neighbours: nothing lost
    s.any_failed = true;
    return consumer_.failed(k, std::move(st));
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
