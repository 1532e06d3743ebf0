#include "src/save/stage.h"

#include <mutex>
#include <utility>
#include <vector>

namespace ckptio {

void copy_state(SaveJob& job, BufferPool& pool, Crew& crew) {
  crew.run([&job, &pool] {
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
      if (job.failed.load()) {
        pool.release(buf);
        buf = nullptr;
      } else {
        stage_range(cursor, job.ranges[i], buf,
                    [&](size_t shard, uint32_t crc, uint64_t n) { crcs.push_back({shard, crc, n}); });
      }
      job.publish(i, buf, std::move(crcs));
    }
  });
  job.producer_finished(job.next_claim);
}

}  // namespace ckptio
