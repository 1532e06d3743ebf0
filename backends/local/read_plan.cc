#include "backends/local/read_plan.h"

#include <algorithm>

namespace ckptio::local {

namespace {

void add_bounced(uint32_t request, uint64_t offset, uint64_t end, uint64_t from, uint64_t to,
                 uint64_t max_bounce, std::vector<ReadPiece>& out) {
  // [from, to) is aligned; the wanted bytes are its intersection with [offset, end).
  for (uint64_t p = from; p < to; p += max_bounce) {
    const uint64_t q = std::min(p + max_bounce, to);
    const uint64_t lo = std::max(p, offset), hi = std::min(q, end);
    if (lo >= hi) continue;
    ReadPiece piece;
    piece.request = request;
    piece.file_offset = p;
    piece.length = q - p;
    piece.bounce = true;
    piece.dst_offset = lo - offset;
    piece.copy_from = lo - p;
    piece.wanted = hi - lo;
    out.push_back(piece);
  }
}

}  // namespace

void plan_read(uint32_t request, uint64_t offset, uint64_t length, uintptr_t dst, uint64_t align,
               uint64_t max_direct, uint64_t max_bounce, std::vector<ReadPiece>& out) {
  if (length == 0) return;
  const uint64_t mask = align - 1;
  const uint64_t end = offset + length;
  const uint64_t outer_lo = offset & ~mask, outer_hi = (end + mask) & ~mask;
  const bool congruent = ((dst ^ offset) & mask) == 0;
  const uint64_t mid_lo = (offset + mask) & ~mask, mid_hi = end & ~mask;
  if (!congruent || mid_lo >= mid_hi) {
    add_bounced(request, offset, end, outer_lo, outer_hi, max_bounce, out);
    return;
  }
  if (offset < mid_lo) add_bounced(request, offset, end, outer_lo, mid_lo, max_bounce, out);
  for (uint64_t p = mid_lo; p < mid_hi; p += max_direct) {
    ReadPiece piece;
    piece.request = request;
    piece.file_offset = p;
    piece.length = std::min(max_direct, mid_hi - p);
    piece.dst_offset = p - offset;
    piece.wanted = piece.length;
    out.push_back(piece);
  }
  if (end > mid_hi) add_bounced(request, offset, end, mid_hi, outer_hi, max_bounce, out);
}

}  // namespace ckptio::local
