// Fuzzes the read planner (src/restore/read_planner.h) and its box geometry
// (src/util/box_runs.h) with leaves, shardings, targets and options derived from
// the input bytes.
//
// Input format (bytes past the end read as 0):
//   rank % 6; rank dims % 14 (the element count is capped at 4096 by halving);
//   element size index % 5 into {1, 2, 3, 4, 8};
//   files: byte % 3 + 1, padding before each piece: (byte >> 2) % 16;
//   per dimension: cut count % 4, then that many cut positions % (dim + 1);
//   options: 5 bytes indexing max_gap, max_read, direct_min_bytes, max_runs,
//     and verify (bit 0) + verify_widen_max_bytes (the rest);
//   damage: byte % 8: 5 = a piece's length off by one, 6 = a piece dropped
//     (a hole), 7 = a piece saved twice (an overlap), else none;
//   target count % 7; per target a byte: odd = repeat the previous target
//     (replication), even = a box from two bytes per dimension.
//
// Properties checked on every input (abort() on a violation, so libFuzzer
// records it as a crash):
//   - plan_reads never crashes, and refuses only with kInvalidArgument (for
//     damaged input: wrong length always, a hole or overlap when some target
//     needs it) or kFailedPrecondition (a read budget below what max_read
//     forces);
//   - an accepted plan, executed against in-memory files holding the saved
//     pieces, fills every target bit-exact, writes every target byte once,
//     never requests a byte twice, keeps reads within max_read, and reports
//     exact statistics, needed/verifiable flags and checksums
//     (tests/testutil/read_plan_harness.h, independent of the planner);
//   - byte_runs for every (piece, target) intersection matches a per-element
//     brute force.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "src/util/box_runs.h"
#include "src/restore/read_planner.h"
#include "tests/testutil/read_plan_harness.h"

namespace {

using namespace ckptio;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "read_planner_fuzz: %s\n", what.c_str());
  std::abort();
}

class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t next() { return i_ < n_ ? d_[i_++] : 0; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

// Brute-force runs: map every element, merge while contiguous on both sides.
std::vector<ByteRun> brute_runs(const Box& saved, uint64_t off, const Box& region, const Box& target,
                                size_t elem) {
  auto local = [](const Box& b, const std::vector<int64_t>& idx) {
    uint64_t f = 0;
    for (size_t d = 0; d < b.rank(); ++d)
      f = f * static_cast<uint64_t>(b.stop[d] - b.start[d]) + (idx[d] - b.start[d]);
    return f;
  };
  std::vector<ByteRun> runs;
  testing::for_each_element(region, [&](const std::vector<int64_t>& idx) {
    const uint64_t s = off + local(saved, idx) * elem, d = local(target, idx) * elem;
    if (!runs.empty() && runs.back().src_offset + runs.back().length == s &&
        runs.back().dst_offset + runs.back().length == d)
      runs.back().length += elem;
    else
      runs.push_back({s, d, elem});
  });
  return runs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const size_t rank = in.next() % 6;
  Shape shape(rank);
  for (auto& e : shape) e = in.next() % 14;
  while (checked_num_bytes(shape).value_or(0) > 4096)
    for (auto& e : shape) e = std::max<int64_t>(1, e / 2);
  static const size_t kElem[] = {1, 2, 3, 4, 8};
  const size_t elem = kElem[in.next() % 5];
  const uint8_t fb = in.next();
  const uint32_t files = fb % 3 + 1;
  const uint64_t padding = (fb >> 2) % 16;
  std::vector<std::vector<int64_t>> cuts(rank);
  for (size_t d = 0; d < rank; ++d) {
    for (int n = in.next() % 4; n-- > 0;) cuts[d].push_back(in.next() % (shape[d] + 1));
    std::sort(cuts[d].begin(), cuts[d].end());
  }
  static const uint64_t kGap[] = {0, 1, 2, 7, 64, 4096, 1 << 20, UINT64_MAX};
  static const uint64_t kRead[] = {1, 2, 3, 8, 100, 4096, 64 << 20, UINT64_MAX};
  static const uint64_t kDirect[] = {0, 1, 16, 256 << 10};
  static const uint64_t kRuns[] = {0, 1, 2, 5, 100, 1 << 20, UINT64_MAX, 1 << 20};
  static const uint64_t kWiden[] = {0, 8, 100, UINT64_MAX};
  PlanOptions o;
  o.max_gap = kGap[in.next() % 8];
  o.max_read = kRead[in.next() % 8];
  o.direct_min_bytes = kDirect[in.next() % 4];
  o.max_runs = kRuns[in.next() % 8];
  const uint8_t vb = in.next();
  o.verify = vb & 1;
  o.verify_widen_max_bytes = kWiden[(vb >> 1) % 4];
  const int damage = in.next() % 8;

  std::vector<Box> targets;
  for (int n = in.next() % 7; n-- > 0;) {
    const uint8_t kind = in.next();
    if (kind & 1) {
      targets.push_back(targets.empty() ? Box::whole(shape) : targets.back());
      continue;
    }
    Box b;
    for (size_t d = 0; d < rank; ++d) {
      int64_t a = in.next() % (shape[d] + 1), z = in.next() % (shape[d] + 1);
      b.start.push_back(std::min(a, z));
      b.stop.push_back(std::max(a, z));
    }
    targets.push_back(b);
  }

  std::vector<Box> boxes = testing::grid_boxes(shape, cuts);
  std::mt19937_64 rng(size);
  for (size_t i = 0; i < size; ++i) rng.seed(rng() ^ data[i]);
  bool expect_invalid = false;
  size_t damaged = 0;
  if (damage == 6 || damage == 7) {
    damaged = rng() % boxes.size();
    bool needed = false;
    for (const Box& t : targets) needed |= intersect(boxes[damaged], t).has_value();
    if (damage == 6) boxes.erase(boxes.begin() + damaged);
    else boxes.push_back(boxes[damaged]);
    expect_invalid = needed;
  }
  testing::SavedArray saved = testing::save_boxes(shape, elem, boxes, files, padding, rng);
  if (damage == 5 && !saved.leaf.pieces.empty()) {
    saved.leaf.pieces[rng() % saved.leaf.pieces.size()].length += 1;
    expect_invalid = true;
  }

  auto plan = plan_reads(saved.leaf, targets, o);
  if (!plan.ok()) {
    const Code c = plan.status().code();
    if (c == Code::kInvalidArgument && expect_invalid) return 0;
    // A budget refusal is only possible when max_runs is below the reads
    // max_read forces: never with 2^20 and reads >= 4096 (the leaf here is
    // at most 32 KiB in at most 1024 pieces and 6 targets).
    if (c == Code::kFailedPrecondition && !expect_invalid && (o.max_runs < (1 << 20) || o.max_read < 4096))
      return 0;
    fail("unexpected refusal: " + plan.status().to_string());
  }
  if (expect_invalid) fail("accepted damaged input");
  const std::string err = testing::check_plan(*plan, saved, targets, o);
  if (!err.empty()) fail("plan check: " + err);

  for (const SavedPiece& p : saved.leaf.pieces)
    for (const Box& t : targets) {
      auto region = intersect(p.box, t);
      if (!region) continue;
      auto runs = byte_runs(p.box, p.offset, *region, t, elem, 1 << 16);
      if (!runs.ok()) fail("byte_runs: " + runs.status().to_string());
      if (*runs != brute_runs(p.box, p.offset, *region, t, elem)) fail("byte_runs differ from brute force");
    }
  return 0;
}
