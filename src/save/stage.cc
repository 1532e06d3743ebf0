#include "src/save/stage.h"

#include <mutex>
#include <utility>
#include <vector>

#include "src/util/allocate.h"

namespace ckptio {

namespace {

// One thread's share of copy_state: claims ranges in order and stages each.
void copy_ranges(SaveJob& job, BufferPool& pool) {
  StreamCursor cursor(job.plan);  // per thread: its ranges increase
  for (;;) {
    std::byte* buf = nullptr;
    size_t i = 0;
    {
      std::lock_guard lock(job.claim_mu);
      if (job.failed.load() || job.next_claim >= job.ranges.size()) return;
      buf = pool.acquire();
      if (!buf) {  // no buffer at all: the write loop ends at the ranges claimed so far
        job.fail(pool.out_of_memory());
        return;
      }
      i = job.next_claim++;
    }
    std::vector<PieceCrc> crcs;
    if (!job.failed.load()) {
      // Range i is claimed: it is published whatever happens, or the
      // worker would wait for it forever. Without memory for its
      // checksums' list the save fails, not the process.
      try {
        stage_range(cursor, job.ranges[i], buf,
                    [&](size_t shard, uint32_t crc, uint64_t n) { crcs.push_back({shard, crc, n}); });
      } catch (...) {
        job.fail(status_of_exception("stage a copy"));
      }
    }
    if (job.failed.load()) {
      pool.release(buf);
      buf = nullptr;
      crcs.clear();
    }
    job.publish(i, buf, std::move(crcs));
  }
}

}  // namespace

void copy_state(SaveJob& job, BufferPool& pool, Crew& crew) {
  // fn of Crew::run must not throw: what does (std::bad_alloc) fails the
  // save. A range claimed is published in any case (below), or the worker
  // would wait for it forever.
  crew.run([&job, &pool] {
    try {
      copy_ranges(job, pool);
    } catch (...) {
      job.fail(status_of_exception("stage a copy"));
    }
  });
  job.producer_finished(job.next_claim);
}

}  // namespace ckptio
