// The read planner (src/restore/read_planner.h) and its box geometry (src/util/box_runs.h):
// cases, then property tests that execute random plans against in-memory
// files and compare every target buffer bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>

#include "src/util/box_runs.h"
#include "src/restore/read_planner.h"
#include "testutil/fork_safety.h"
#include "testutil/read_plan_harness.h"

namespace ckptio {
namespace {

using testing::check_plan;
using testing::grid_boxes;
using testing::save_boxes;
using testing::SavedArray;

Box B(std::vector<int64_t> start, std::vector<int64_t> stop) { return Box{std::move(start), std::move(stop)}; }

// ---- Intersection ----------------------------------------------------------

TEST(BoxIntersect, OverlapIsTheCommonPart) {
  auto r = intersect(B({0, 2}, {4, 8}), B({2, 0}, {6, 5}));
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, B({2, 2}, {4, 5}));
}

TEST(BoxIntersect, DisjointAndTouchingAreEmpty) {
  EXPECT_FALSE(intersect(B({0, 0}, {4, 4}), B({5, 0}, {6, 4})));
  EXPECT_FALSE(intersect(B({0, 0}, {4, 4}), B({4, 0}, {6, 4})));  // touching: no element
  EXPECT_FALSE(intersect(B({0, 0}, {4, 4}), B({0, 4}, {4, 9})));
}

TEST(BoxIntersect, RankZeroIsOneElement) {
  auto r = intersect(Box{}, Box{});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank(), 0u);
  EXPECT_EQ(box_elements(*r), 1u);
  EXPECT_FALSE(box_is_empty(Box{}));
}

TEST(BoxIntersect, EmptyBoxesIntersectNothing) {
  EXPECT_FALSE(intersect(B({0, 3}, {4, 3}), B({0, 0}, {4, 8})));  // zero-size dim
  EXPECT_FALSE(intersect(B({0}, {0}), B({0}, {0})));
  EXPECT_TRUE(box_is_empty(B({2}, {2})));
  EXPECT_EQ(box_elements(B({0, 3}, {4, 3})), 0u);
}

TEST(BoxIntersect, RankMismatchIsEmpty) {
  EXPECT_FALSE(intersect(B({0}, {4}), B({0, 0}, {4, 4})));
  EXPECT_FALSE(intersect(Box{}, B({0}, {1})));
}

TEST(BoxIntersect, ContainsAndSelf) {
  const Box a = B({1, 2, 3}, {4, 5, 6});
  EXPECT_EQ(intersect(a, a), a);
  EXPECT_TRUE(box_contains(B({0, 0, 0}, {4, 5, 6}), a));
  EXPECT_FALSE(box_contains(B({2, 0, 0}, {4, 5, 6}), a));
}

TEST(BoxUnion, IdenticalDisjointAndOverlapping) {
  std::vector<Box> same = {B({0, 0}, {4, 4}), B({0, 0}, {4, 4}), B({0, 0}, {4, 4})};
  EXPECT_EQ(union_elements(same), 16u);
  std::vector<Box> disjoint = {B({0, 0}, {2, 4}), B({2, 0}, {4, 4}), B({9, 9}, {9, 12})};
  EXPECT_EQ(union_elements(disjoint), 16u);
  std::vector<Box> overlap = {B({0, 0}, {3, 3}), B({1, 1}, {4, 4}), B({2, 0}, {3, 4})};
  EXPECT_EQ(union_elements(overlap), 9u + 9u - 4u);  // the third box adds nothing
  std::vector<Box> none;
  EXPECT_EQ(union_elements(none), 0u);
  std::vector<Box> scalar = {Box{}, Box{}};
  EXPECT_EQ(union_elements(scalar), 1u);
}

TEST(BoxUnion, MatchesBruteForce) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t rank = rng() % 4;
    Shape shape(rank);
    for (auto& e : shape) e = 1 + rng() % 6;
    std::vector<Box> boxes(rng() % 6);
    for (Box& b : boxes)
      for (size_t d = 0; d < rank; ++d) {
        int64_t a = rng() % (shape[d] + 1), z = rng() % (shape[d] + 1);
        b.start.push_back(std::min(a, z));
        b.stop.push_back(std::max(a, z));
      }
    std::set<std::vector<int64_t>> cells;
    for (const Box& b : boxes) testing::for_each_element(b, [&](const std::vector<int64_t>& i) { cells.insert(i); });
    EXPECT_EQ(union_elements(boxes), cells.size()) << "iter " << iter;
  }
}

// ---- Byte runs -------------------------------------------------------------

TEST(BoxRuns, RankZeroIsOneRun) {
  auto runs = byte_runs(Box{}, 100, Box{}, Box{}, 8, 10);
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0], (ByteRun{100, 0, 8}));
}

TEST(BoxRuns, OneDimensionalSubRange) {
  auto runs = byte_runs(B({10}, {30}), 1000, B({15}, {22}), B({12}, {40}), 4, 10);
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0], (ByteRun{1000 + 5 * 4, 3 * 4, 7 * 4}));
}

TEST(BoxRuns, FullRowsCollapseIntoOneRun) {
  // Rows 2..5 of an 8x16 shard into a target holding rows 0..7 whole.
  auto l = run_layout(B({0, 0}, {8, 16}), 0, B({2, 0}, {5, 16}), B({0, 0}, {8, 16}), 2);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->dims.empty());
  EXPECT_EQ(l->run_bytes, 3u * 16 * 2);
  EXPECT_EQ(l->src_base, 2u * 16 * 2);
  EXPECT_EQ(l->dst_base, 2u * 16 * 2);
}

TEST(BoxRuns, PartialRowsGiveOneRunPerRow) {
  // Columns 4..8 of rows 1..3 of an 4x10 shard at offset 64, into a target
  // box [1,3)x[2,9).
  auto runs = byte_runs(B({0, 0}, {4, 10}), 64, B({1, 4}, {3, 8}), B({1, 2}, {3, 9}), 1, 100);
  ASSERT_TRUE(runs.ok());
  std::vector<ByteRun> want = {{64 + 14, 2, 4}, {64 + 24, 9, 4}};
  EXPECT_EQ(*runs, want);
}

TEST(BoxRuns, TargetContiguityMattersToo) {
  // Source rows are whole (contiguous) but the target is wider: one run per row.
  auto l = run_layout(B({0, 0}, {3, 4}), 0, B({0, 0}, {3, 4}), B({0, 0}, {3, 8}), 1);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->dims.size(), 1u);
  EXPECT_EQ(l->dims[0], (CopyDim{3, 4, 8}));
  EXPECT_EQ(l->run_bytes, 4u);
  EXPECT_EQ(l->src_span(), 12u);  // rows 0..2 of 4 bytes, back to back
  EXPECT_EQ(l->dst_span(), 20u);  // rows at 0, 8, 16 of 4 bytes each
}

TEST(BoxRuns, ContiguousLoopsFuse) {
  // [4,6,8] shard, region [4,6,2) at column 2: dims 0 and 1 fuse into one loop of 24.
  auto l = run_layout(B({0, 0, 0}, {4, 6, 8}), 0, B({0, 0, 2}, {4, 6, 4}), B({0, 0, 2}, {4, 6, 4}), 4);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->dims.size(), 1u);
  EXPECT_EQ(l->dims[0], (CopyDim{24, 32, 8}));
  EXPECT_EQ(l->num_runs(), 24u);
}

TEST(BoxRuns, ExtentOneDimensionsAreDropped) {
  auto l = run_layout(B({0, 0, 0, 0, 0}, {2, 1, 3, 1, 5}), 0, B({1, 0, 0, 0, 0}, {2, 1, 3, 1, 5}),
                      B({1, 0, 0, 0, 0}, {2, 1, 3, 1, 5}), 1);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->dims.empty());
  EXPECT_EQ(l->run_bytes, 15u);
  EXPECT_EQ(l->src_base, 15u);
}

TEST(BoxRuns, EmptyRegionAndZeroSizeDimsAreRefused) {
  EXPECT_FALSE(run_layout(B({0, 0}, {4, 0}), 0, B({0, 0}, {4, 0}), B({0, 0}, {4, 0}), 1).ok());
  EXPECT_FALSE(run_layout(B({0}, {4}), 0, B({2}, {2}), B({0}, {4}), 1).ok());
  EXPECT_FALSE(run_layout(B({0}, {4}), 0, B({2}, {6}), B({0}, {8}), 1).ok());  // outside the shard
  EXPECT_FALSE(run_layout(B({0}, {4}), 0, B({0}, {4}), B({0}, {4}), 0).ok());  // element size 0
  EXPECT_FALSE(run_layout(B({0}, {4}), UINT64_MAX - 2, B({0}, {4}), B({0}, {4}), 1).ok());
}

TEST(BoxRuns, RunCountIsCheckedBeforeListing) {
  // One column of a 2^30 x 2^30 byte array: 2^30 runs of one byte. The
  // layout is O(rank); the explicit list is refused without allocating.
  const int64_t n = int64_t{1} << 30;
  auto l = run_layout(B({0, 0}, {n, n}), 0, B({0, 7}, {n, 8}), B({0, 7}, {n, 8}), 1);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_runs(), uint64_t{1} << 30);
  EXPECT_EQ(l->run_bytes, 1u);
  auto runs = byte_runs(B({0, 0}, {n, n}), 0, B({0, 7}, {n, 8}), B({0, 7}, {n, 8}), 1, 1000);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), Code::kFailedPrecondition);
}

// Brute force: map every element, cut where either side stops being
// contiguous; the layout must give exactly these runs.
std::vector<ByteRun> brute_runs(const Box& saved, uint64_t off, const Box& region, const Box& target, size_t elem) {
  std::vector<ByteRun> runs;
  auto local = [](const Box& b, const std::vector<int64_t>& idx) {
    uint64_t f = 0;
    for (size_t d = 0; d < b.rank(); ++d) f = f * static_cast<uint64_t>(b.stop[d] - b.start[d]) + (idx[d] - b.start[d]);
    return f;
  };
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

Box random_sub_box(const Box& outer, std::mt19937_64& rng, bool non_empty) {
  Box b;
  for (size_t d = 0; d < outer.rank(); ++d) {
    const int64_t n = outer.stop[d] - outer.start[d];
    int64_t a = rng() % (n + 1), z = rng() % (n + 1);
    if (a > z) std::swap(a, z);
    if (non_empty && a == z) {
      if (z < n) ++z; else --a;
    }
    b.start.push_back(outer.start[d] + a);
    b.stop.push_back(outer.start[d] + z);
  }
  return b;
}

TEST(BoxRuns, FiveDimensionalAndRandomMatchBruteForce) {
  std::mt19937_64 rng(11);
  const int64_t sizes[] = {1, 2, 3, 5, 7};
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t rank = iter < 500 ? 5 : rng() % 6;
    Shape shape(rank);
    for (auto& e : shape) e = sizes[rng() % 5];
    const Box global = Box::whole(shape);
    const Box saved = random_sub_box(global, rng, true);
    const Box region = random_sub_box(saved, rng, true);
    // A target containing the region, possibly larger.
    Box target = region;
    for (size_t d = 0; d < rank; ++d) {
      target.start[d] -= rng() % (region.start[d] - global.start[d] + 1);
      target.stop[d] += rng() % (global.stop[d] - region.stop[d] + 1);
    }
    const size_t elem = 1 + rng() % 4;
    const uint64_t off = rng() % 100;
    auto runs = byte_runs(saved, off, region, target, elem, 1 << 20);
    ASSERT_TRUE(runs.ok()) << runs.status().to_string();
    EXPECT_EQ(*runs, brute_runs(saved, off, region, target, elem)) << "iter " << iter;
  }
}

TEST(BoxRuns, ClipKeepsExactlyTheBytesInRange) {
  // Every (source byte -> destination byte) pair of a random layout inside
  // [lo, hi) comes out of the clipped parts once, in source order, in at
  // most 2 * loops + 1 parts.
  std::mt19937_64 rng(5);
  const int64_t sizes[] = {1, 2, 3, 4, 7};
  for (int iter = 0; iter < 1500; ++iter) {
    const size_t rank = 1 + rng() % 4;
    Shape shape(rank);
    for (auto& e : shape) e = sizes[rng() % 5];
    const Box saved = random_sub_box(Box::whole(shape), rng, true);
    const Box region = random_sub_box(saved, rng, true);
    const size_t elem = 1 + rng() % 3;
    auto l = run_layout(saved, 10, region, region, elem);
    ASSERT_TRUE(l.ok());
    const uint64_t end = 10 + *box_elements(saved) * elem;
    uint64_t lo = 10 + rng() % (end - 10 + 1), hi = 10 + rng() % (end - 10 + 1);
    if (lo > hi) std::swap(lo, hi);
    std::vector<std::pair<uint64_t, uint64_t>> want, got;
    for_each_run(*l, [&](uint64_t s, uint64_t d, uint64_t n) {
      for (uint64_t b = 0; b < n; ++b)
        if (s + b >= lo && s + b < hi) want.push_back({s + b, d + b});
    });
    const std::vector<RunLayout> parts = clip_layout(*l, lo, hi);
    EXPECT_LE(parts.size(), 2 * l->dims.size() + 1);
    for (const RunLayout& part : parts)
      for_each_run(part, [&](uint64_t s, uint64_t d, uint64_t n) {
        for (uint64_t b = 0; b < n; ++b) got.push_back({s + b, d + b});
      });
    EXPECT_EQ(got, want) << "iter " << iter << " lo " << lo << " hi " << hi;
  }
}

// ---- The plan: cases -------------------------------------------------------

struct Case {
  SavedArray saved;
  std::vector<Box> targets;
};

Case make_case(const Shape& shape, size_t elem, const std::vector<Box>& saved_boxes,
               std::vector<Box> targets, uint64_t padding = 0, uint32_t files = 1, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  Case c{save_boxes(shape, elem, saved_boxes, files, padding, rng), std::move(targets)};
  if (padding == 0 && files == 1) {
    // Keep pieces in box order so tests can reason about offsets.
    uint64_t at = 0;
    c.saved.files[0].clear();
    for (size_t i = 0; i < saved_boxes.size(); ++i) {
      SavedPiece& p = c.saved.leaf.pieces[i];
      p.offset = at;
      auto bytes = testing::box_bytes(shape, elem, saved_boxes[i]);
      c.saved.files[0].insert(c.saved.files[0].end(), bytes.begin(), bytes.end());
      at += bytes.size();
    }
  }
  return c;
}

ReadPlan plan_ok(const Case& c, const PlanOptions& o) {
  auto plan = plan_reads(c.saved.leaf, c.targets, o);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  if (!plan.ok()) return {};
  EXPECT_EQ(check_plan(*plan, c.saved, c.targets, o), "");
  return std::move(plan).value();
}

PlanOptions opts(uint64_t max_gap, uint64_t max_read = 64 << 20, uint64_t direct_min = 256 << 10, bool verify = false) {
  PlanOptions o;
  o.max_gap = max_gap;
  o.max_read = max_read;
  o.direct_min_bytes = direct_min;
  o.verify = verify;
  return o;
}

TEST(ReadPlanCases, SameShardingLandsEveryShardDirectly) {
  const Shape shape = {8, 16};
  std::vector<Box> rows = grid_boxes(shape, {{2, 4, 6}, {}});
  Case c = make_case(shape, 4, rows, rows);
  ReadPlan p = plan_ok(c, opts(0, 64 << 20, 0));
  ASSERT_EQ(p.reads.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p.reads[i].target, i);
    EXPECT_EQ(p.reads[i].dst_offset, 0u);
    EXPECT_EQ(p.reads[i].length, 2u * 16 * 4);
  }
  EXPECT_TRUE(p.copies.empty());
  EXPECT_EQ(p.staging_bytes, 0u);
  EXPECT_EQ(p.stats.bytes_read, p.stats.bytes_needed);
  EXPECT_EQ(p.stats.bytes_direct, 8u * 16 * 4);
}

TEST(ReadPlanCases, SmallNeighboursCoalesceIntoOneStagedRead) {
  const Shape shape = {8, 16};
  std::vector<Box> rows = grid_boxes(shape, {{2, 4, 6}, {}});
  Case c = make_case(shape, 4, rows, rows);
  ReadPlan p = plan_ok(c, opts(0));  // direct_min 256 KiB: these 128-byte shards merge
  ASSERT_EQ(p.reads.size(), 1u);
  EXPECT_EQ(p.reads[0].length, 8u * 16 * 4);
  EXPECT_EQ(p.stats.copies, 4u);
}

TEST(ReadPlanCases, WholeLeafFromOneShardIsOneDirectRead) {
  const Shape shape = {300, 7};
  Case c = make_case(shape, 2, {Box::whole(shape)}, {Box::whole(shape)});
  ReadPlan p = plan_ok(c, opts(4096));
  ASSERT_EQ(p.reads.size(), 1u);
  EXPECT_EQ(p.reads[0].target, 0u);
  EXPECT_TRUE(p.copies.empty());
}

TEST(ReadPlanCases, GapZeroReadsEachRunGapAboveMergesThem) {
  // A 16x16 byte shard; the target is columns 0..4: runs of 4 bytes, gaps of 12.
  const Shape shape = {16, 16};
  Case c = make_case(shape, 1, {Box::whole(shape)}, {B({0, 0}, {16, 4})});
  ReadPlan p0 = plan_ok(c, opts(0));
  EXPECT_EQ(p0.reads.size(), 16u);
  EXPECT_EQ(p0.stats.bytes_read, 64u);
  EXPECT_EQ(p0.stats.bytes_needed, 64u);
  ReadPlan p11 = plan_ok(c, opts(11));
  EXPECT_EQ(p11.reads.size(), 16u);
  ReadPlan p12 = plan_ok(c, opts(12));
  ASSERT_EQ(p12.reads.size(), 1u);
  EXPECT_EQ(p12.stats.bytes_read, 15u * 16 + 4);
  EXPECT_EQ(p12.copies.size(), 1u);  // one strided copy, not 16
  EXPECT_EQ(p12.stats.units, 1u);    // found in O(rank), not by listing 16 runs
}

TEST(ReadPlanCases, GapMergesAcrossPiecesToo) {
  // Two row shards stored with 100 garbage bytes between them.
  const Shape shape = {4, 8};
  Case c = make_case(shape, 1, {B({0, 0}, {2, 8}), B({2, 0}, {4, 8})}, {Box::whole(shape)});
  c.saved.files[0].insert(c.saved.files[0].begin() + 16, 100, std::byte{0xEE});
  c.saved.leaf.pieces[1].offset += 100;
  EXPECT_EQ(plan_ok(c, opts(99)).reads.size(), 2u);
  ReadPlan p = plan_ok(c, opts(100));
  ASSERT_EQ(p.reads.size(), 1u);
  EXPECT_EQ(p.stats.bytes_read, 132u);
}

TEST(ReadPlanCases, MaxReadSplitsLongRanges) {
  const Shape shape = {1000};
  Case c = make_case(shape, 1, {Box::whole(shape)}, {Box::whole(shape)});
  ReadPlan direct = plan_ok(c, opts(0, 300, 0));
  ASSERT_EQ(direct.reads.size(), 4u);
  EXPECT_EQ(direct.reads[3].length, 100u);
  for (const auto& r : direct.reads) EXPECT_NE(r.target, kStaging);
  EXPECT_TRUE(direct.copies.empty());
  // Staged (direct_min too high for a 1000-byte range... but a lone
  // contiguous range still lands directly, chunk by chunk).
  ReadPlan staged = plan_ok(c, opts(0, 300));
  EXPECT_EQ(staged.reads.size(), 4u);
}

TEST(ReadPlanCases, MaxReadCutsInsideStridedRegions) {
  // Columns 1..6 of a 9x9 shard of 8-byte elements, gaps merged, reads of 50
  // bytes: cuts fall inside runs and between them; copies are clipped.
  const Shape shape = {9, 9};
  Case c = make_case(shape, 8, {Box::whole(shape)}, {B({0, 1}, {9, 6}), B({3, 0}, {9, 9})});
  for (uint64_t max_read : {1, 7, 8, 50, 72, 1000}) {
    for (uint64_t gap : {0, 24, 100}) plan_ok(c, opts(gap, max_read));
  }
}

TEST(ReadPlanCases, ReplicatedTargetsReadEachByteOnce) {
  const Shape shape = {6, 10};
  std::vector<Box> cols = grid_boxes(shape, {{}, {3, 7}});
  const Box whole = Box::whole(shape);
  Case c = make_case(shape, 4, cols, {whole, whole, whole});
  ReadPlan p = plan_ok(c, opts(0, 64 << 20, 0));
  EXPECT_EQ(p.stats.bytes_read, 240u);
  EXPECT_EQ(p.stats.bytes_needed, 240u);
  EXPECT_EQ(p.stats.bytes_delivered, 720u);
  // Column shards are strided in the target: staged once, copied three times.
  EXPECT_EQ(p.stats.bytes_copied, 720u);
  // A replicated target of one row-contiguous shard lands in target 0 and is
  // copied from there to the others.
  Case rows = make_case(shape, 4, {whole}, {whole, whole, whole});
  ReadPlan q = plan_ok(rows, opts(0, 64 << 20, 0));
  ASSERT_EQ(q.reads.size(), 1u);
  EXPECT_EQ(q.reads[0].target, 0u);
  EXPECT_EQ(q.stats.bytes_direct, 240u);
  EXPECT_EQ(q.stats.bytes_copied, 480u);
  EXPECT_EQ(q.staging_bytes, 0u);
}

TEST(ReadPlanCases, OverlappingTargetsShareReads) {
  const Shape shape = {10, 10};
  Case c = make_case(shape, 2, grid_boxes(shape, {{5}, {5}}),
                     {B({0, 0}, {6, 6}), B({4, 4}, {10, 10}), B({2, 0}, {3, 10})});
  for (uint64_t gap : {0, 8, 1000}) {
    ReadPlan p = plan_ok(c, opts(gap));
    EXPECT_EQ(p.stats.bytes_needed, 2u * (36 + 36 - 4 + 10 - 6 - 0));
  }
}

TEST(ReadPlanCases, ScalarAndEmptyTargets) {
  Case c = make_case({}, 8, {Box{}}, {Box{}, Box{}});
  ReadPlan p = plan_ok(c, opts(0));
  EXPECT_EQ(p.stats.bytes_read, 8u);
  EXPECT_EQ(p.stats.bytes_delivered, 16u);
  const Shape shape = {4, 0, 3};
  Case z = make_case(shape, 4, {Box::whole(shape)}, {Box::whole(shape), B({1, 0, 0}, {2, 0, 3})});
  ReadPlan q = plan_ok(z, opts(0));
  EXPECT_TRUE(q.reads.empty());
  EXPECT_EQ(q.target_bytes, (std::vector<uint64_t>{0, 0}));
  Case e = make_case({5}, 1, {B({0}, {5}), B({2}, {2})}, {B({3}, {3})});
  EXPECT_TRUE(plan_ok(e, opts(0)).reads.empty());
}

TEST(ReadPlanCases, VerifyWidensSmallPartlyNeededPieces) {
  const Shape shape = {64, 64};
  Case c = make_case(shape, 1, grid_boxes(shape, {{32}, {}}), {B({0, 0}, {40, 16})});
  PlanOptions off = opts(0);
  ReadPlan p = plan_ok(c, off);
  EXPECT_EQ(p.stats.bytes_read, 40u * 16);
  EXPECT_FALSE(p.pieces[0].verifiable);
  EXPECT_EQ(p.stats.pieces_unverified, 2u);
  PlanOptions on = off;
  on.verify = true;
  on.verify_widen_max_bytes = 2048;  // each piece is 32*64 = 2048 bytes
  ReadPlan w = plan_ok(c, on);
  EXPECT_EQ(w.stats.bytes_read, 4096u);
  EXPECT_TRUE(w.pieces[0].verifiable && w.pieces[1].verifiable);
  EXPECT_EQ(w.stats.pieces_widened, 2u);
  EXPECT_EQ(w.stats.pieces_unverified, 0u);
  on.verify_widen_max_bytes = 2047;  // too big to widen: read in part, unverified
  ReadPlan n = plan_ok(c, on);
  EXPECT_EQ(n.stats.bytes_read, 40u * 16);
  EXPECT_EQ(n.stats.pieces_unverified, 2u);
}

TEST(ReadPlanCases, FullyReadPiecesAreVerifiableWithoutWidening) {
  // Two targets that together need all of a piece make it verifiable.
  const Shape shape = {8, 8};
  Case c = make_case(shape, 1, {Box::whole(shape)}, {B({0, 0}, {8, 3}), B({0, 3}, {8, 8})});
  ReadPlan p = plan_ok(c, opts(0));
  EXPECT_TRUE(p.pieces[0].verifiable);
  EXPECT_EQ(p.stats.bytes_read, 64u);
}

TEST(ReadPlanCases, HolesOverlapsAndBadInputAreRefused) {
  const Shape shape = {4, 4};
  Case hole = make_case(shape, 1, {B({0, 0}, {2, 4})}, {Box::whole(shape)});
  auto r = plan_reads(hole.saved.leaf, hole.targets);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("hole"), std::string::npos) << r.status().message();
  Case overlap = make_case(shape, 1, {B({0, 0}, {3, 4}), B({2, 0}, {4, 4})}, {Box::whole(shape)});
  EXPECT_NE(plan_reads(overlap.saved.leaf, overlap.targets).status().message().find("overlapping"),
            std::string::npos);
  Case ok = make_case(shape, 1, {Box::whole(shape)}, {Box::whole(shape)});
  SavedLeaf bad = ok.saved.leaf;
  bad.pieces[0].length = 15;
  EXPECT_FALSE(plan_reads(bad, ok.targets).ok());
  bad = ok.saved.leaf;
  bad.pieces[0].offset = UINT64_MAX - 3;
  EXPECT_FALSE(plan_reads(bad, ok.targets).ok());
  bad = ok.saved.leaf;
  bad.element_size = 0;
  EXPECT_FALSE(plan_reads(bad, ok.targets).ok());
  std::vector<Box> outside = {B({0, 0}, {5, 4})};
  EXPECT_FALSE(plan_reads(ok.saved.leaf, outside).ok());
  std::vector<Box> wrong_rank = {B({0}, {4})};
  EXPECT_FALSE(plan_reads(ok.saved.leaf, wrong_rank).ok());
}

TEST(ReadPlanCases, RunExplosionIsCoarsenedNotListed) {
  // One byte column of a 2^18 x 16 array with max_gap 0: 2^18 one-byte runs.
  const int64_t n = int64_t{1} << 18;
  const Shape shape = {n, 16};
  Case c = make_case(shape, 1, {Box::whole(shape)}, {B({0, 5}, {n, 6})});
  PlanOptions o = opts(0, 1 << 20);
  o.max_runs = 1000;
  ReadPlan p = plan_ok(c, o);
  EXPECT_LE(p.stats.units, 1000u);
  EXPECT_EQ(p.stats.regions_coarsened, 1u);
  EXPECT_LE(p.stats.bytes_read, uint64_t(n) * 16);
  EXPECT_LE(p.reads.size(), 1000u);
  EXPECT_EQ(p.copies.size(), p.reads.size());  // strided, one per read
}

TEST(ReadPlanCases, HugeLeavesPlanInTimeIndependentOfElements) {
  // A 2^40-byte leaf in 8 row shards, restored into 3 uneven row targets and
  // one column: nothing is allocated per element or per run.
  const int64_t rows = int64_t{1} << 20, cols = int64_t{1} << 20;
  const Shape shape = {rows, cols};
  SavedLeaf leaf;
  leaf.shape = shape;
  leaf.element_size = 1;
  for (int64_t i = 0; i < 8; ++i) {
    const Box b = B({i * rows / 8, 0}, {(i + 1) * rows / 8, cols});
    leaf.pieces.push_back(SavedPiece{b, 0, uint64_t(i) * (uint64_t(rows) / 8) * uint64_t(cols),
                                     uint64_t(rows / 8) * uint64_t(cols), 0});
  }
  std::vector<Box> targets = {B({0, 0}, {rows / 3, cols}), B({rows / 3, 0}, {2 * rows / 3, cols}),
                              B({2 * rows / 3, 0}, {rows, cols})};
  const auto t0 = std::chrono::steady_clock::now();
  auto p = plan_reads(leaf, targets);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->stats.bytes_read, uint64_t{1} << 40);
  // Contiguous ranges cut at 64 MiB, plus one short read where a target
  // boundary falls inside a shard.
  EXPECT_LE(p->reads.size(), (uint64_t{1} << 40) / (64 << 20) + 2);
  EXPECT_TRUE(p->copies.empty());
  // A one-column target needs 2^20 runs one row (1 MiB) apart: max_gap
  // cannot merge them and max_runs is 2^20, so it fits exactly.
  std::vector<Box> column = {B({0, 3}, {rows, 4})};
  auto q = plan_reads(leaf, column);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->stats.bytes_read, uint64_t(rows));
  // With a budget of 1000 reads it is refused: any coarser plan reads
  // everything in 16,384 reads of 64 MiB.
  PlanOptions o;
  o.max_runs = 1000;
  auto r = plan_reads(leaf, column, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  // A plan walking the 2^40 elements would take hours; under a sanitizer on
  // a 2-core PVM guest with the suite beside it, the plans took 27.6 s.
  const bool sanitized = testutil::under_thread_sanitizer() || testutil::under_address_sanitizer();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(sanitized ? 120 : 20));
}

TEST(ReadPlanCases, FromIndexRecord) {
  LeafRecord leaf;
  leaf.path = "w";
  leaf.dtype = DType::kFloat32;
  leaf.shape = {4, 4};
  leaf.shards.push_back(ShardRecord{B({0, 0}, {2, 4}), "b.bin", 0, 32, 11});
  leaf.shards.push_back(ShardRecord{B({2, 0}, {4, 4}), "a.bin", 64, 32, 22});
  std::vector<std::string> files = {"a.bin"};
  SavedLeaf s = saved_leaf_from_record(leaf, &files);
  EXPECT_EQ(files, (std::vector<std::string>{"a.bin", "b.bin"}));
  EXPECT_EQ(s.element_size, 4u);
  ASSERT_EQ(s.pieces.size(), 2u);
  EXPECT_EQ(s.pieces[0].file, 1u);
  EXPECT_EQ(s.pieces[1].file, 0u);
  EXPECT_EQ(s.pieces[1].offset, 64u);
  EXPECT_EQ(s.pieces[1].crc32c, 22u);
}

// ---- The plan: properties --------------------------------------------------

Shape random_shape(std::mt19937_64& rng, size_t rank) {
  static const int64_t kSizes[] = {0, 1, 1, 2, 3, 4, 5, 7, 8, 11, 13};
  Shape s(rank);
  for (auto& e : s) e = kSizes[rng() % std::size(kSizes)];
  // Keep the brute-force checks cheap.
  while (checked_num_bytes(s).value_or(0) > 6000)
    for (auto& e : s) e = std::max<int64_t>(1, e / 2);
  return s;
}

std::vector<std::vector<int64_t>> random_cuts(std::mt19937_64& rng, const Shape& shape, int max_parts) {
  std::vector<std::vector<int64_t>> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    const int parts = 1 + rng() % max_parts;
    for (int i = 1; i < parts; ++i) cuts[d].push_back(shape[d] ? rng() % (shape[d] + 1) : 0);
    std::sort(cuts[d].begin(), cuts[d].end());
  }
  return cuts;
}

PlanOptions random_options(std::mt19937_64& rng) {
  static const uint64_t kGaps[] = {0, 1, 3, 16, 100, 1 << 20};
  static const uint64_t kReads[] = {1, 5, 16, 64, 257, 4096, 64 << 20};
  static const uint64_t kDirect[] = {0, 16, 256 << 10};
  static const uint64_t kRuns[] = {1, 3, 50, 1 << 20, 1 << 20, 1 << 20};
  static const uint64_t kWiden[] = {0, 40, 1 << 20};
  PlanOptions o;
  o.max_gap = kGaps[rng() % std::size(kGaps)];
  o.max_read = kReads[rng() % std::size(kReads)];
  o.direct_min_bytes = kDirect[rng() % std::size(kDirect)];
  o.max_runs = kRuns[rng() % std::size(kRuns)];
  o.verify = rng() % 2;
  o.verify_widen_max_bytes = kWiden[rng() % std::size(kWiden)];
  return o;
}

std::vector<Box> random_targets(std::mt19937_64& rng, const Shape& shape) {
  std::vector<Box> t;
  switch (rng() % 3) {
    case 0: {  // a sharding: a grid, maybe replicated
      t = grid_boxes(shape, random_cuts(rng, shape, 4));
      const size_t copies = 1 + rng() % 2;
      const size_t n = t.size();
      for (size_t c = 1; c < copies; ++c)
        for (size_t i = 0; i < n; ++i) t.push_back(t[i]);
      break;
    }
    case 1:  // arbitrary, overlapping boxes
      for (int i = 1 + rng() % 4; i-- > 0;) t.push_back(random_sub_box(Box::whole(shape), rng, false));
      break;
    default:  // the whole leaf, replicated
      for (int i = 1 + rng() % 3; i-- > 0;) t.push_back(Box::whole(shape));
  }
  if (t.size() > 12) t.resize(12);
  std::shuffle(t.begin(), t.end(), rng);
  return t;
}

TEST(ReadPlanProperty, RandomShardingsRestoreBitExact) {
  std::mt19937_64 rng(2026);
  int planned = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t rank = rng() % 6;
    const Shape shape = random_shape(rng, rank);
    const size_t elem = std::vector<size_t>{1, 2, 3, 4, 8}[rng() % 5];
    const std::vector<Box> saved_boxes = grid_boxes(shape, random_cuts(rng, shape, 4));
    const uint64_t padding = rng() % 2 ? 0 : rng() % 20;
    SavedArray saved = save_boxes(shape, elem, saved_boxes, 1 + rng() % 3, padding, rng);
    const std::vector<Box> targets = random_targets(rng, shape);
    const PlanOptions o = random_options(rng);
    SCOPED_TRACE("iter " + std::to_string(iter) + " shape " + shape_to_string(shape) + " elem " +
                 std::to_string(elem) + " gap " + std::to_string(o.max_gap) + " max_read " +
                 std::to_string(o.max_read) + " max_runs " + std::to_string(o.max_runs));
    auto plan = plan_reads(saved.leaf, targets, o);
    if (!plan.ok()) {
      // Only a tight budget may refuse: max_runs below what max_read forces.
      ASSERT_EQ(plan.status().code(), Code::kFailedPrecondition) << plan.status().to_string();
      ASSERT_LT(o.max_runs, 1u << 20);
      ++refused;
      continue;
    }
    ++planned;
    ASSERT_EQ(check_plan(*plan, saved, targets, o), "");
    uint64_t file_bytes = 0;
    for (const auto& f : saved.files) file_bytes += f.size();
    EXPECT_LE(plan->stats.bytes_read, file_bytes);
    if (padding == 0) {
      EXPECT_LE(plan->stats.bytes_read, checked_num_bytes(shape, elem).value());
    }
    // With no gap filling, widening or coarsening, exactly the needed bytes.
    if (o.max_gap == 0 && (!o.verify || o.verify_widen_max_bytes == 0) && plan->stats.regions_coarsened == 0) {
      EXPECT_EQ(plan->stats.bytes_read, plan->stats.bytes_needed);
    }
  }
  EXPECT_GT(planned, 2400);  // about 10% draw a budget too tight for their max_read
  RecordProperty("refused", refused);
}

TEST(ReadPlanProperty, ReplicatedShardingsNeverReadTwice) {
  std::mt19937_64 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    const Shape shape = random_shape(rng, 1 + rng() % 4);
    const size_t elem = 1 + rng() % 4;
    SavedArray saved = save_boxes(shape, elem, grid_boxes(shape, random_cuts(rng, shape, 3)), 1, 0, rng);
    std::vector<Box> one = grid_boxes(shape, random_cuts(rng, shape, 3));
    std::vector<Box> targets = one;
    for (int r = 0; r < 3; ++r) targets.insert(targets.end(), one.begin(), one.end());
    PlanOptions o = opts(0);
    auto plan = plan_reads(saved.leaf, targets, o);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_EQ(check_plan(*plan, saved, targets, o), "") << "iter " << iter;
    EXPECT_EQ(plan->stats.bytes_read, checked_num_bytes(shape, elem).value());
    EXPECT_EQ(plan->stats.bytes_delivered, 4 * plan->stats.bytes_read);
  }
}

}  // namespace
}  // namespace ckptio
