#include "backends/s3/read_plan.h"

#include <algorithm>
#include <numeric>

namespace ckptio::s3 {

std::vector<RangedGet> plan_gets(std::span<const ReadRequest> requests, uint64_t max_get) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const ReadRequest& x = requests[a];
    const ReadRequest& y = requests[b];
    return x.key != y.key ? x.key < y.key : x.offset < y.offset;
  });
  std::vector<RangedGet> gets;
  for (size_t i : order) {
    const ReadRequest& r = requests[i];
    uint64_t done = 0;
    while (done < r.length) {
      const uint64_t at = r.offset + done;
      RangedGet* g = gets.empty() ? nullptr : &gets.back();
      if (!g || g->key != r.key || g->offset + g->length != at || g->length >= max_get) {
        gets.push_back(RangedGet{r.key, at, 0, {}});
        g = &gets.back();
      }
      const uint64_t n = std::min(r.length - done, max_get - g->length);
      g->dst.emplace_back(r.dst + done, n);
      g->length += n;
      done += n;
    }
  }
  return gets;
}

}  // namespace ckptio::s3
