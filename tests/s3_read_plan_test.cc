#include <gtest/gtest.h>

#include <vector>

#include "backends/s3/read_plan.h"

namespace ckptio::s3 {
namespace {

std::byte buf[1000];

TEST(S3ReadPlan, MergesAdjacentRequestsOfOneObjectInOffsetOrder) {
  std::vector<ReadRequest> reqs = {
      {"a", 100, 50, buf + 500},  // after the next one in the object
      {"a", 0, 100, buf},
      {"b", 150, 10, buf + 900},
      {"a", 200, 10, buf + 700},  // a gap before it: its own GET
      {"a", 150, 0, buf},         // empty: no GET
  };
  auto gets = plan_gets(reqs, 1000);
  ASSERT_EQ(gets.size(), 3u);
  EXPECT_EQ(gets[0].key, "a");
  EXPECT_EQ(gets[0].offset, 0u);
  EXPECT_EQ(gets[0].length, 150u);
  ASSERT_EQ(gets[0].dst.size(), 2u);
  EXPECT_EQ(gets[0].dst[0].data(), buf);
  EXPECT_EQ(gets[0].dst[0].size(), 100u);
  EXPECT_EQ(gets[0].dst[1].data(), buf + 500);
  EXPECT_EQ(gets[1].offset, 200u);
  EXPECT_EQ(gets[2].key, "b");
}

TEST(S3ReadPlan, SplitsAtMaxGetEvenInsideARequest) {
  std::vector<ReadRequest> reqs = {{"a", 0, 25, buf}, {"a", 25, 20, buf + 100}};
  auto gets = plan_gets(reqs, 10);
  ASSERT_EQ(gets.size(), 5u);
  uint64_t total = 0;
  for (size_t i = 0; i < gets.size(); ++i) {
    EXPECT_EQ(gets[i].offset, i * 10);
    EXPECT_LE(gets[i].length, 10u);
    uint64_t sum = 0;
    for (auto d : gets[i].dst) sum += d.size();
    EXPECT_EQ(sum, gets[i].length);
    total += gets[i].length;
  }
  EXPECT_EQ(total, 45u);
  // The third GET holds the end of the first request and the start of the second.
  ASSERT_EQ(gets[2].dst.size(), 2u);
  EXPECT_EQ(gets[2].dst[0].data(), buf + 20);
  EXPECT_EQ(gets[2].dst[0].size(), 5u);
  EXPECT_EQ(gets[2].dst[1].data(), buf + 100);
}

TEST(S3ReadPlan, OverlappingRequestsAreServedSeparately) {
  std::vector<ReadRequest> reqs = {{"a", 0, 10, buf}, {"a", 5, 10, buf + 50}};
  auto gets = plan_gets(reqs, 100);
  ASSERT_EQ(gets.size(), 2u);
  EXPECT_EQ(gets[1].offset, 5u);
  EXPECT_TRUE(plan_gets({}, 100).empty());
}

}  // namespace
}  // namespace ckptio::s3
