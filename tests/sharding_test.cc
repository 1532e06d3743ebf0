// The sharding model (include/ckptio/sharding.h): meshes, partition specs and
// their JSON, the boxes of devices checked against hand-computed JAX results
// and against a second implementation written the way JAX computes them
// (iota tile assignment, then a product over dimensions), partition rules
// case by case against eformer's semantics, and sharding trees.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckptio/sharding.h"
#include "src/sharding/regex.h"

namespace ckptio {
namespace {

using Axes = std::vector<std::vector<std::string>>;

Mesh mesh_of(std::string_view text) {
  Result<Mesh> m = Mesh::parse(text);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : Mesh();
}

Box box(std::vector<int64_t> start, std::vector<int64_t> stop) { return Box{std::move(start), std::move(stop)}; }

std::vector<DeviceBox> map_of(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape,
                              Uneven uneven = Uneven::kReject) {
  auto r = devices_indices_map({mesh, spec}, shape, uneven);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<DeviceBox>{};
}

// The boxes of a 1-D map, in mesh order.
std::vector<std::pair<int64_t, int64_t>> ranges(const std::vector<DeviceBox>& m) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const DeviceBox& d : m) out.push_back({d.box.start.at(0), d.box.stop.at(0)});
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const Status& status_of(const Status& s) { return s; }
template <typename T>
const Status& status_of(const Result<T>& r) {
  return r.status();
}

// Expects `expr` (a Status or Result) to fail with `want` and a message
// containing every one of the following strings.
#define EXPECT_ERROR(expr, want, ...)                                                  \
  do {                                                                                  \
    const auto& _r = (expr);                                                            \
    const Status& _s = status_of(_r);                                                   \
    ASSERT_FALSE(_s.ok()) << #expr " unexpectedly succeeded";                           \
    EXPECT_EQ(_s.code(), want) << _s.to_string();                                       \
    for (const std::string& _n : std::vector<std::string>{__VA_ARGS__})                 \
      EXPECT_TRUE(contains(_s.message(), _n)) << "message lacks \"" << _n << "\": " << _s.message(); \
  } while (0)

// ---- Mesh --------------------------------------------------------------------

TEST(Mesh, CreateLaysDevicesOutRowMajor) {
  Result<Mesh> m = Mesh::create({{"dp", 2}, {"tp", 3}}, {10, 11, 12, 13, 14, 15});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->num_devices(), 6u);
  EXPECT_EQ(m->axis_index("tp"), 1u);
  EXPECT_EQ(m->axis_index("zz"), std::nullopt);
  // np.array(ids).reshape(2, 3): position 4 is row 1, column 1.
  EXPECT_EQ(m->coordinates(0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(m->coordinates(2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(m->coordinates(4), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(m->to_string(), "dp=2,tp=3");
}

TEST(Mesh, WithoutAxesHoldsOneDevice) {
  Result<Mesh> m = Mesh::create({}, {7});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->num_devices(), 1u);
  EXPECT_EQ(m->coordinates(0), std::vector<int64_t>{});
  EXPECT_ERROR(Mesh::create({}, {}), Code::kInvalidArgument, "1 devices");
}

TEST(Mesh, CreateRejectsWhatJaxRejects) {
  EXPECT_ERROR(Mesh::create({{"", 2}}), Code::kInvalidArgument, "empty name");
  EXPECT_ERROR(Mesh::create({{"x", 2}, {"x", 2}}), Code::kInvalidArgument, "'x' appears twice");
  EXPECT_ERROR(Mesh::create({{"x", 0}}), Code::kInvalidArgument, "'x' has size 0");
  EXPECT_ERROR(Mesh::create({{"x", -3}}), Code::kInvalidArgument, "'x' has size -3");
  EXPECT_ERROR(Mesh::create({{"x", 2}}, {0, 1, 2}), Code::kInvalidArgument, "2 devices", "3 device ids");
  EXPECT_ERROR(Mesh::create({{"x", 2}}, {5, 5}), Code::kInvalidArgument, "device id 5 appears twice");
  EXPECT_ERROR(Mesh::create({{"x", 2}}, {0, -1}), Code::kInvalidArgument, "-1 is negative");
  EXPECT_ERROR(Mesh::create({{"a", int64_t{1} << 20}, {"b", 2}}), Code::kInvalidArgument, "more than", "'b'");
  EXPECT_ERROR(Mesh::create({{"a", INT64_MAX}, {"b", INT64_MAX}}), Code::kInvalidArgument, "more than");
}

TEST(Mesh, ParsesTheCliText) {
  Mesh m = mesh_of("dp=2,tp=4");
  EXPECT_EQ(m.axes(), (std::vector<MeshAxis>{{"dp", 2}, {"tp", 4}}));
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(m.device_ids(), ids);
  EXPECT_EQ(mesh_of(" dp = 2 ,\ttp=4 "), m);
  EXPECT_EQ(mesh_of("x=1").num_devices(), 1u);
  EXPECT_EQ(Mesh::parse(m.to_string())->axes(), m.axes());
}

TEST(Mesh, ParseErrorsNameTheItem) {
  EXPECT_ERROR(Mesh::parse(""), Code::kInvalidArgument, "empty item");
  EXPECT_ERROR(Mesh::parse("dp=2,"), Code::kInvalidArgument, "empty item");
  EXPECT_ERROR(Mesh::parse("dp"), Code::kInvalidArgument, "\"dp\" is not name=size");
  EXPECT_ERROR(Mesh::parse("dp="), Code::kInvalidArgument, "size \"\" of axis 'dp'");
  EXPECT_ERROR(Mesh::parse("=2"), Code::kInvalidArgument, "no axis name");
  EXPECT_ERROR(Mesh::parse("dp=0"), Code::kInvalidArgument, "size \"0\"");
  EXPECT_ERROR(Mesh::parse("dp=x"), Code::kInvalidArgument, "size \"x\"");
  EXPECT_ERROR(Mesh::parse("dp=2x"), Code::kInvalidArgument, "size \"2x\"");
  EXPECT_ERROR(Mesh::parse("dp=-2"), Code::kInvalidArgument, "size \"-2\"");
  EXPECT_ERROR(Mesh::parse("dp=99999999999999999999"), Code::kInvalidArgument, "99999999999999999999");
  EXPECT_ERROR(Mesh::parse("d p=2"), Code::kInvalidArgument, "\"d p\"");
  EXPECT_ERROR(Mesh::parse("dp=2=3"), Code::kInvalidArgument, "size \"2=3\"");
  EXPECT_ERROR(Mesh::parse("dp=2,dp=2"), Code::kInvalidArgument, "mesh \"dp=2,dp=2\"", "appears twice");
  EXPECT_ERROR(Mesh::parse("a=1048576,b=2"), Code::kInvalidArgument, "more than");
}

// ---- PartitionSpec -----------------------------------------------------------

TEST(PartitionSpec, PrintsAsJaxAndAsJson) {
  PartitionSpec p = PartitionSpec::of({{}, {"tp"}, {"dp", "tp"}});
  EXPECT_EQ(p.to_string(), "PartitionSpec(None, 'tp', ('dp', 'tp'))");
  EXPECT_EQ(p.to_json(), R"([null,"tp",["dp","tp"]])");
  EXPECT_EQ(PartitionSpec{}.to_string(), "PartitionSpec()");
  EXPECT_EQ(PartitionSpec{}.to_json(), "[]");
  // A name that is not UTF-8 must not make printing throw.
  EXPECT_FALSE(PartitionSpec::of({{"\xff"}}).to_json().empty());
}

TEST(PartitionSpec, ParsesJaxEntries) {
  Result<PartitionSpec> p = parse_partition_spec_json(R"([null, "tp", ["dp", "tp"]])");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(*p, PartitionSpec::of({{}, {"tp"}, {"dp", "tp"}}));
  EXPECT_EQ(*parse_partition_spec_json("[]"), PartitionSpec{});
  // JAX treats ("tp",) as "tp" and () as None; so does the parser.
  EXPECT_EQ(*parse_partition_spec_json(R"([["tp"], []])"), PartitionSpec::of({{"tp"}, {}}));
  // Round trip through to_json.
  for (const char* text : {"[]", "[null]", R"(["a",null,["b","c","d"]])", R"([["x","y"],"z"])"}) {
    Result<PartitionSpec> q = parse_partition_spec_json(text);
    ASSERT_TRUE(q.ok()) << text;
    EXPECT_EQ(*parse_partition_spec_json(q->to_json()), *q) << text;
  }
}

TEST(PartitionSpec, JsonErrorsNameTheLocation) {
  EXPECT_ERROR(parse_partition_spec_json(""), Code::kInvalidArgument, "spec: invalid JSON at byte");
  EXPECT_ERROR(parse_partition_spec_json("[\"a\""), Code::kInvalidArgument, "spec: invalid JSON");
  EXPECT_ERROR(parse_partition_spec_json("null"), Code::kInvalidArgument, "spec: expected a PartitionSpec", "null");
  EXPECT_ERROR(parse_partition_spec_json(R"("tp")"), Code::kInvalidArgument, "spec: expected", "string");
  EXPECT_ERROR(parse_partition_spec_json("{}"), Code::kInvalidArgument, "spec: expected", "object");
  EXPECT_ERROR(parse_partition_spec_json("[1]"), Code::kInvalidArgument, "spec[0]: expected null", "number");
  EXPECT_ERROR(parse_partition_spec_json("[true]"), Code::kInvalidArgument, "spec[0]:", "boolean");
  EXPECT_ERROR(parse_partition_spec_json(R"([null, ["a", 1]])"), Code::kInvalidArgument, "spec[1][1]:", "number");
  EXPECT_ERROR(parse_partition_spec_json(R"([null, ["a", null]])"), Code::kInvalidArgument, "spec[1][1]:");
  EXPECT_ERROR(parse_partition_spec_json(R"([""])"), Code::kInvalidArgument, "spec[0]: axis names are non-empty");
  EXPECT_ERROR(parse_partition_spec_json(R"([[["a"]]])"), Code::kInvalidArgument, "nested deeper than 2",
               "byte 2");
  EXPECT_ERROR(parse_partition_spec_json("[\"\xff\"]"), Code::kInvalidArgument, "spec: invalid JSON");
  EXPECT_ERROR(parse_partition_spec_json("[] []"), Code::kInvalidArgument, "spec: invalid JSON");
  EXPECT_ERROR(parse_partition_spec_json(std::string(2 << 20, ' ')), Code::kInvalidArgument, "limit");
  EXPECT_ERROR(parse_partition_spec_json(std::string(100000, '[')), Code::kInvalidArgument, "nested deeper");
  // Brackets inside strings are not nesting.
  EXPECT_EQ(*parse_partition_spec_json(R"(["[[[[", "\"[[["])"), PartitionSpec::of({{"[[[["}, {"\"[[["}}));
}

TEST(PartitionSpec, JsonNeverCrashesOnRandomInput) {
  std::mt19937 rng(7);
  const std::string alphabet = "[]{}\",:nul tfrae0123-.\\x\xff";
  const std::string valid = R"([null, "tp", ["dp", "tp"]])";
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    if (i % 2) {
      s = valid;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
        s[rng() % s.size()] = alphabet[rng() % alphabet.size()];
    } else {
      for (size_t n = rng() % 24; n > 0; --n) s += alphabet[rng() % alphabet.size()];
    }
    Result<PartitionSpec> r = parse_partition_spec_json(s);
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind("spec", 0), 0u) << r.status().message();
    }
  }
}

TEST(PartitionSpec, ValidatedAgainstTheMesh) {
  Mesh m = mesh_of("dp=2,tp=4");
  EXPECT_TRUE(validate_partition_spec(PartitionSpec::of({{"dp", "tp"}}), m).ok());
  EXPECT_TRUE(validate_partition_spec(PartitionSpec{}, m).ok());
  EXPECT_ERROR(validate_partition_spec(PartitionSpec::of({{}, {"zz"}}), m), Code::kInvalidArgument,
               "axis 'zz' (dimension 1)", "dp=2,tp=4");
  EXPECT_ERROR(validate_partition_spec(PartitionSpec::of({{"tp"}, {"tp"}}), m), Code::kInvalidArgument,
               "'tp' more than once", "PartitionSpec('tp', 'tp')");
  EXPECT_ERROR(validate_partition_spec(PartitionSpec::of({{"dp", "dp"}}), m), Code::kInvalidArgument,
               "'dp' more than once");
}

// ---- devices_indices_map: hand-computed JAX results --------------------------

TEST(ShardingBoxes, EvenSplitOverOneAxis) {
  // Mesh(np.arange(4), ("x",)), P("x"), shape (8,): slices 0:2, 2:4, 4:6, 6:8.
  auto m = map_of(mesh_of("x=4"), PartitionSpec::of({{"x"}}), {8});
  EXPECT_EQ(ranges(m), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i].device_id, static_cast<int64_t>(i));
    EXPECT_EQ(m[i].replica_id, 0);
  }
}

TEST(ShardingBoxes, TwoAxesOnTwoDimensions) {
  // dp=2, tp=4; P("dp", "tp") on (8, 12): device at (dp, tp) holds
  // [4dp, 4dp+4) x [3tp, 3tp+3).
  auto m = map_of(mesh_of("dp=2,tp=4"), PartitionSpec::of({{"dp"}, {"tp"}}), {8, 12});
  ASSERT_EQ(m.size(), 8u);
  for (int64_t p = 0; p < 8; ++p) {
    int64_t dp = p / 4, tp = p % 4;
    EXPECT_EQ(m[p].box, box({4 * dp, 3 * tp}, {4 * dp + 4, 3 * tp + 3})) << p;
  }
}

TEST(ShardingBoxes, TupleAxesAreMajorToMinor) {
  Mesh mesh = mesh_of("dp=2,tp=4");
  // ("dp", "tp"): chunk = dp * 4 + tp = the flat position, so device p holds [2p, 2p+2).
  auto a = map_of(mesh, PartitionSpec::of({{"dp", "tp"}}), {16});
  for (int64_t p = 0; p < 8; ++p) EXPECT_EQ(ranges(a)[p], std::make_pair(2 * p, 2 * p + 2)) << p;
  // ("tp", "dp"): chunk = tp * 2 + dp. JAX's tile assignment is
  // arange(8).reshape(2, 4).transpose(1, 0) = [0, 4, 1, 5, 2, 6, 3, 7], so
  // devices 0..7 take chunks 0, 2, 4, 6, 1, 3, 5, 7.
  auto b = map_of(mesh, PartitionSpec::of({{"tp", "dp"}}), {16});
  const int64_t chunks[] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int64_t p = 0; p < 8; ++p) EXPECT_EQ(ranges(b)[p], std::make_pair(2 * chunks[p], 2 * chunks[p] + 2)) << p;
}

TEST(ShardingBoxes, UnnamedAxesReplicate) {
  // P(None, "tp") on dp=2, tp=4: devices p and p + 4 hold the same box.
  auto m = map_of(mesh_of("dp=2,tp=4"), PartitionSpec::of({{}, {"tp"}}), {4, 8});
  for (int64_t p = 0; p < 8; ++p) {
    EXPECT_EQ(m[p].box, box({0, 2 * (p % 4)}, {4, 2 * (p % 4) + 2})) << p;
    EXPECT_EQ(m[p].replica_id, p / 4) << p;
  }
  // PartitionSpec() replicates everything: replica ids count in mesh order.
  auto r = map_of(mesh_of("dp=2,tp=4"), PartitionSpec{}, {3, 5});
  for (int64_t p = 0; p < 8; ++p) {
    EXPECT_EQ(r[p].box, Box::whole({3, 5}));
    EXPECT_EQ(r[p].replica_id, p);
  }
}

TEST(ShardingBoxes, JaxDocstringExample) {
  // named_sharding_to_xla_hlo_sharding's own example: shape (8, 4, 2, 2),
  // mesh a=b=c=d=2, P(None, ("d", "b"), "c"): dim 1 takes chunk 2d + b,
  // dim 2 takes chunk c, axis a replicates.
  auto m = map_of(mesh_of("a=2,b=2,c=2,d=2"), PartitionSpec::of({{}, {"d", "b"}, {"c"}}), {8, 4, 2, 2});
  ASSERT_EQ(m.size(), 16u);
  for (int64_t p = 0; p < 16; ++p) {
    int64_t a = p / 8, b = p / 4 % 2, c = p / 2 % 2, d = p % 2;
    int64_t k = 2 * d + b;
    EXPECT_EQ(m[p].box, box({0, k, c, 0}, {8, k + 1, c + 1, 2})) << p;
    EXPECT_EQ(m[p].replica_id, a) << p;
  }
}

TEST(ShardingBoxes, ThreeAxisMesh) {
  // a=2, b=3, c=2; P(("c", "a"), None, "b") on (8, 5, 9): dim 0 chunk 2c + a
  // of 4 (size 2), dim 2 chunk b of 3 (size 3).
  auto m = map_of(mesh_of("a=2,b=3,c=2"), PartitionSpec::of({{"c", "a"}, {}, {"b"}}), {8, 5, 9});
  ASSERT_EQ(m.size(), 12u);
  for (int64_t p = 0; p < 12; ++p) {
    int64_t a = p / 6, b = p / 2 % 3, c = p % 2;
    int64_t k = 2 * c + a;
    EXPECT_EQ(m[p].box, box({2 * k, 0, 3 * b}, {2 * k + 2, 5, 3 * b + 3})) << p;
    EXPECT_EQ(m[p].replica_id, 0);
  }
}

TEST(ShardingBoxes, UnevenIsRejectedAsJaxDoes) {
  // JAX: Sharding.shard_shape raises IndivisibleError for 10 over 4.
  EXPECT_ERROR(devices_indices_map({mesh_of("x=4"), PartitionSpec::of({{"x"}})}, {10}), Code::kInvalidArgument,
               "dimension 0 of size 10", "split 4 ways", "IndivisibleError");
  EXPECT_ERROR(validate_sharding({mesh_of("x=2,y=3"), PartitionSpec::of({{"x"}, {"y"}})}, {4, 4}),
               Code::kInvalidArgument, "dimension 1 of size 4", "split 3 ways");
  // Zero divides evenly: every device holds an empty box.
  auto z = map_of(mesh_of("x=4"), PartitionSpec::of({{"x"}}), {0});
  for (const DeviceBox& d : z) EXPECT_EQ(d.box, box({0}, {0}));
}

TEST(ShardingBoxes, UnevenPadsAsXlaTiles) {
  Mesh x4 = mesh_of("x=4");
  using R = std::vector<std::pair<int64_t, int64_t>>;
  // 10 over 4: tile ceil(10/4) = 3.
  EXPECT_EQ(ranges(map_of(x4, PartitionSpec::of({{"x"}}), {10}, Uneven::kPad)), (R{{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  // 5 over 4: tile 2, the last chunk [6, 8) clipped to [5, 5): empty.
  EXPECT_EQ(ranges(map_of(x4, PartitionSpec::of({{"x"}}), {5}, Uneven::kPad)), (R{{0, 2}, {2, 4}, {4, 5}, {5, 5}}));
  // 1 over 4: one element, three empty chunks.
  EXPECT_EQ(ranges(map_of(x4, PartitionSpec::of({{"x"}}), {1}, Uneven::kPad)), (R{{0, 1}, {1, 1}, {1, 1}, {1, 1}}));
  // 4096 over 3: 1366, 1366, 1364.
  EXPECT_EQ(ranges(map_of(mesh_of("x=3"), PartitionSpec::of({{"x"}}), {4096}, Uneven::kPad)),
            (R{{0, 1366}, {1366, 2732}, {2732, 4096}}));
  // Even shapes give the same boxes under both rules.
  EXPECT_EQ(map_of(x4, PartitionSpec::of({{"x"}}), {8}, Uneven::kPad), map_of(x4, PartitionSpec::of({{"x"}}), {8}));
}

TEST(ShardingBoxes, RankZeroAndSizeOneDimensions) {
  Mesh m = mesh_of("x=2,y=2");
  auto s = map_of(m, PartitionSpec{}, {});
  ASSERT_EQ(s.size(), 4u);
  for (int64_t p = 0; p < 4; ++p) {
    EXPECT_EQ(s[p].box, Box{});
    EXPECT_EQ(s[p].replica_id, p);
  }
  auto u = unique_shards({m, PartitionSpec{}}, {});
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->size(), 1u);
  EXPECT_EQ((*u)[0].writer_device_id, 0);
  EXPECT_EQ((*u)[0].holders, (std::vector<int64_t>{0, 1, 2, 3}));
  // A size-1 dimension split 2 ways is uneven; unsplit it is fine.
  EXPECT_FALSE(validate_sharding({m, PartitionSpec::of({{"x"}})}, {1, 4}).ok());
  auto one = map_of(m, PartitionSpec::of({{}, {"x"}}), {1, 4});
  EXPECT_EQ(one[0].box, box({0, 0}, {1, 2}));
  EXPECT_EQ(one[3].box, box({0, 2}, {1, 4}));
  auto padded = map_of(m, PartitionSpec::of({{"x"}}), {1, 4}, Uneven::kPad);
  EXPECT_EQ(padded[2].box, box({1, 0}, {1, 4}));  // empty
}

TEST(ShardingBoxes, ShardingErrors) {
  Mesh m = mesh_of("x=2");
  EXPECT_ERROR(devices_indices_map({m, PartitionSpec::of({{"x"}})}, {}), Code::kInvalidArgument, "1 entries",
               "rank 0");
  EXPECT_ERROR(devices_indices_map({m, PartitionSpec::of({{}, {}, {}})}, {2, 2}), Code::kInvalidArgument,
               "3 entries", "rank 2");
  EXPECT_ERROR(devices_indices_map({m, PartitionSpec::of({{"y"}})}, {2}), Code::kInvalidArgument, "axis 'y'");
  EXPECT_ERROR(devices_indices_map({m, PartitionSpec{}}, {2, -1}), Code::kInvalidArgument, "dimension 1 is negative");
  EXPECT_ERROR(devices_indices_map({Mesh(), PartitionSpec{}}, {2}), Code::kInvalidArgument, "no devices");
  EXPECT_ERROR(unique_shards({m, PartitionSpec::of({{"x"}})}, {3}), Code::kInvalidArgument, "split 2 ways");
}

TEST(ShardingBoxes, HugeDimensionsDoNotOverflow) {
  const int64_t big = INT64_MAX;
  auto m = map_of(mesh_of("x=3"), PartitionSpec::of({{"x"}}), {big}, Uneven::kPad);
  const int64_t t = big / 3 + 1;
  EXPECT_EQ(ranges(m), (std::vector<std::pair<int64_t, int64_t>>{{0, t}, {t, 2 * t}, {2 * t, big}}));
}

TEST(ShardingBoxes, WriterIsTheLowestDeviceIdNotTheFirstReplica) {
  // Device ids in mesh order 7, 3, 5, 1; P("x") replicates over y.
  Result<Mesh> m = Mesh::create({{"x", 2}, {"y", 2}}, {7, 3, 5, 1});
  ASSERT_TRUE(m.ok());
  auto map = map_of(*m, PartitionSpec::of({{"x"}}), {4});
  EXPECT_EQ(map[0].device_id, 7);
  EXPECT_EQ(map[0].replica_id, 0);  // JAX's replica 0 is the first in mesh order
  EXPECT_EQ(map[1].device_id, 3);
  EXPECT_EQ(map[1].replica_id, 1);
  auto u = unique_shards({*m, PartitionSpec::of({{"x"}})}, {4});
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->size(), 2u);
  EXPECT_EQ((*u)[0].box, box({0}, {2}));
  EXPECT_EQ((*u)[0].holders, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ((*u)[0].writer_device_id, 3);
  EXPECT_EQ((*u)[1].box, box({2}, {4}));
  EXPECT_EQ((*u)[1].writer_device_id, 1);
}

// ---- devices_indices_map: properties against a JAX-shaped reference ----------

// devices_indices_map computed the way JAX does: an iota tile assignment
// (mesh positions reshaped to the mesh, transposed so that the spec's axes
// come first in spec order and the unnamed axes last, flattened), then
// op_sharding_to_numpy_indices' product over dimensions, each tile given to
// num_replicas consecutive entries of the assignment. Chunk bounds use XLA's
// TileOffsetForDevice / TileLimitForDevice.
std::vector<DeviceBox> reference_map(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape) {
  const auto& axes = mesh.axes();
  const size_t n = mesh.num_devices();
  std::vector<int64_t> parts(shape.size(), 1);
  std::vector<size_t> perm;
  std::vector<bool> used(axes.size(), false);
  for (size_t d = 0; d < spec.size(); ++d)
    for (const std::string& name : spec.dims[d].axes) {
      size_t a = *mesh.axis_index(name);
      parts[d] *= axes[a].size;
      perm.push_back(a);
      used[a] = true;
    }
  int64_t replicas = 1;
  for (size_t a = 0; a < axes.size(); ++a)
    if (!used[a]) {
      perm.push_back(a);
      replicas *= axes[a].size;
    }
  std::vector<int64_t> stride(axes.size(), 1);  // row-major strides of mesh positions
  for (size_t a = axes.size(); a-- > 1;) stride[a - 1] = stride[a] * axes[a].size;
  std::vector<size_t> tiles;  // tile assignment: entry k is a mesh position
  for (size_t flat = 0; flat < n; ++flat) {
    size_t rest = flat, pos = 0;
    for (size_t k = perm.size(); k-- > 0;) {
      const auto size = static_cast<size_t>(axes[perm[k]].size);
      pos += (rest % size) * static_cast<size_t>(stride[perm[k]]);
      rest /= size;
    }
    tiles.push_back(pos);
  }
  std::vector<Box> at(n);
  int64_t num_tiles = 1;
  for (int64_t p : parts) num_tiles *= p;
  size_t next = 0;
  for (int64_t t = 0; t < num_tiles; ++t) {  // itertools.product: the last dimension fastest
    Box b = Box::whole(shape);
    int64_t rest = t;
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t i = rest % parts[d];
      rest /= parts[d];
      const int64_t ceil = (shape[d] + parts[d] - 1) / parts[d];
      b.start[d] = std::min(i * ceil, shape[d]);
      b.stop[d] = std::min((i + 1) * ceil, shape[d]);
    }
    for (int64_t r = 0; r < replicas; ++r) at[tiles[next++]] = b;
  }
  std::vector<DeviceBox> out;
  std::map<std::pair<Shape, Shape>, int64_t> seen;
  for (size_t p = 0; p < n; ++p)
    out.push_back({mesh.device_ids()[p], at[p], seen[{at[p].start, at[p].stop}]++});
  return out;
}

struct Case {
  Mesh mesh;
  PartitionSpec spec;
  Shape shape;
};

Case random_case(std::mt19937& rng) {
  static const std::vector<int64_t> kDims = {0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13};
  Case c;
  std::vector<MeshAxis> axes;
  const size_t num_axes = rng() % 4;  // 0 to 3 axes
  for (size_t a = 0; a < num_axes; ++a) {
    std::string name(1, 'a');  // not "a" + ...: GCC 12 warns falsely (-Wrestrict) on that
    name += std::to_string(a);
    axes.push_back({name, 1 + int64_t(rng() % 4)});
  }
  int64_t n = 1;
  for (const auto& a : axes) n *= a.size;
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 100);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.mesh = *Mesh::create(axes, ids);
  const size_t rank = rng() % 6;  // 0 to 5
  do {
    c.shape.clear();
    for (size_t d = 0; d < rank; ++d) c.shape.push_back(kDims[rng() % kDims.size()]);
  } while (checked_num_bytes(c.shape).value() > 6000);
  std::vector<std::string> free;
  for (const auto& a : axes) free.push_back(a.name);
  std::shuffle(free.begin(), free.end(), rng);
  const size_t entries = rank ? rng() % (rank + 1) : 0;
  for (size_t d = 0; d < entries; ++d) {
    DimSharding dim;
    size_t take = free.empty() ? 0 : rng() % 3 == 0 ? 0 : 1 + rng() % free.size();
    for (size_t k = 0; k < take; ++k) {
      dim.axes.push_back(free.back());
      free.pop_back();
    }
    c.spec.dims.push_back(dim);
  }
  return c;
}

bool divides_evenly(const Case& c) {
  for (size_t d = 0; d < c.spec.size(); ++d) {
    int64_t parts = 1;
    for (const auto& name : c.spec.dims[d].axes) parts *= c.mesh.axes()[*c.mesh.axis_index(name)].size;
    if (c.shape[d] % parts) return false;
  }
  return true;
}

TEST(ShardingProperty, MatchesTheJaxShapedReference) {
  std::mt19937 rng(20261123);
  int even = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Case c = random_case(rng);
    SCOPED_TRACE("mesh {" + c.mesh.to_string() + "} " + c.spec.to_string() + " shape " + shape_to_string(c.shape));
    auto padded = devices_indices_map({c.mesh, c.spec}, c.shape, Uneven::kPad);
    ASSERT_TRUE(padded.ok()) << padded.status().to_string();
    ASSERT_EQ(*padded, reference_map(c.mesh, c.spec, c.shape));
    auto strict = devices_indices_map({c.mesh, c.spec}, c.shape, Uneven::kReject);
    ASSERT_EQ(strict.ok(), divides_evenly(c)) << strict.status().to_string();
    if (strict.ok()) {
      ++even;
      ASSERT_EQ(*strict, *padded);
      for (const DeviceBox& d : *strict) ASSERT_EQ(d.box.extent(), (*strict)[0].box.extent());
    }
  }
  EXPECT_GT(even, 300);  // both branches are exercised
}

TEST(ShardingProperty, UniqueBoxesCoverTheArrayExactlyOnce) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 3000; ++iter) {
    Case c = random_case(rng);
    SCOPED_TRACE("mesh {" + c.mesh.to_string() + "} " + c.spec.to_string() + " shape " + shape_to_string(c.shape));
    auto map = devices_indices_map({c.mesh, c.spec}, c.shape, Uneven::kPad);
    auto unique = unique_shards({c.mesh, c.spec}, c.shape, Uneven::kPad);
    ASSERT_TRUE(map.ok() && unique.ok());
    // Brute force: count how often each element is covered by a distinct box.
    const size_t rank = c.shape.size();
    std::vector<int> count(checked_num_bytes(c.shape).value(), 0);
    std::set<std::pair<Shape, Shape>> distinct;
    size_t holders = 0;
    for (size_t i = 0; i < unique->size(); ++i) {
      const UniqueShard& u = (*unique)[i];
      ASSERT_EQ(u.box.rank(), rank);
      ASSERT_TRUE(distinct.insert({u.box.start, u.box.stop}).second) << "box listed twice";
      if (i) {
        ASSERT_LT(std::make_pair((*unique)[i - 1].box.start, (*unique)[i - 1].box.stop),
                  std::make_pair(u.box.start, u.box.stop));
      }
      ASSERT_FALSE(u.holders.empty());
      ASSERT_TRUE(std::is_sorted(u.holders.begin(), u.holders.end()));
      ASSERT_EQ(u.writer_device_id, u.holders.front());
      holders += u.holders.size();
      for (size_t d = 0; d < rank; ++d) {
        ASSERT_LE(0, u.box.start[d]);
        ASSERT_LE(u.box.start[d], u.box.stop[d]);
        ASSERT_LE(u.box.stop[d], c.shape[d]);
      }
      // Every element of the box, in C order.
      std::vector<int64_t> at(u.box.start);
      bool empty = false;
      for (size_t d = 0; d < rank; ++d) empty |= u.box.start[d] == u.box.stop[d];
      while (!empty) {
        size_t flat = 0;
        for (size_t d = 0; d < rank; ++d) flat = flat * static_cast<size_t>(c.shape[d]) + static_cast<size_t>(at[d]);
        ++count[flat];
        size_t d = rank;
        while (d > 0 && ++at[d - 1] == u.box.stop[d - 1]) {
          at[d - 1] = u.box.start[d - 1];
          --d;
        }
        if (d == 0) break;
      }
    }
    for (size_t i = 0; i < count.size(); ++i) ASSERT_EQ(count[i], 1) << "element " << i;
    ASSERT_EQ(holders, c.mesh.num_devices());
    // Every device's box is one of them, the device is among its holders, and
    // its replica id counts the earlier holders in mesh order.
    for (size_t i = 0; i < map->size(); ++i) {
      const DeviceBox& d = (*map)[i];
      auto it = std::find_if(unique->begin(), unique->end(), [&](const UniqueShard& u) { return u.box == d.box; });
      ASSERT_NE(it, unique->end());
      ASSERT_TRUE(std::binary_search(it->holders.begin(), it->holders.end(), d.device_id));
      const auto earlier = std::count_if(map->begin(), map->begin() + static_cast<std::ptrdiff_t>(i),
                                         [&](const DeviceBox& e) { return e.box == d.box; });
      ASSERT_EQ(d.replica_id, earlier);
    }
  }
}

// ---- Partition rules ---------------------------------------------------------

PartitionRules rules_of(std::vector<PartitionRule> rules) {
  Result<PartitionRules> r = PartitionRules::compile(std::move(rules));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : PartitionRules();
}

const Shape kBig = {256, 256};  // 65,536 elements: above eformer's 16,384

TEST(Rules, PathsAreMatchedWithSlashes) {
  EXPECT_EQ(rule_match_path("params.layers.0.attn.q_proj.kernel"), "params/layers/0/attn/q_proj/kernel");
  EXPECT_EQ(rule_match_path("model/layers/0/w"), "model/layers/0/w");
  EXPECT_EQ(rule_match_path("a/b.c"), "a/b/c");
  PartitionRules r = rules_of({{"attn/q_proj/kernel", PartitionSpec::of({{"tp"}})}});
  EXPECT_TRUE(match_partition_rules(r, "params.layers.0.attn.q_proj.kernel", kBig).ok());
  // A rule written against dots does not see them: they became slashes.
  PartitionRules dotted = rules_of({{"attn\\.q_proj", PartitionSpec{}}});
  EXPECT_FALSE(match_partition_rules(dotted, "params.layers.0.attn.q_proj.kernel", kBig).ok());
}

TEST(Rules, FirstMatchWins) {
  PartitionRules r = rules_of({{"q_proj/kernel", PartitionSpec::of({{"fsdp"}, {"tp"}})},
                               {"kernel", PartitionSpec::of({{"tp"}, {"fsdp"}})},
                               {".*", PartitionSpec{}}});
  auto q = match_partition_rules(r, "params.layers.0.attn.q_proj.kernel", kBig);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->rule_index, 0);
  EXPECT_EQ(q->spec, PartitionSpec::of({{"fsdp"}, {"tp"}}));
  auto o = match_partition_rules(r, "params.layers.0.attn.o_proj.kernel", kBig);
  EXPECT_EQ(o->rule_index, 1);
  EXPECT_EQ(o->spec, PartitionSpec::of({{"tp"}, {"fsdp"}}));
  auto b = match_partition_rules(r, "params.layers.0.attn.o_proj.bias", {65536});
  EXPECT_EQ(b->rule_index, 2);
  EXPECT_EQ(b->spec, PartitionSpec{});
  EXPECT_FALSE(b->small);
}

TEST(Rules, SearchNotMatch) {
  const std::string path = "params.layers.0.attn.q_proj.kernel";
  auto hit = [&](const std::string& re) {
    return rules_of({{re, PartitionSpec{}}}).first_match(rule_match_path(path)).has_value();
  };
  EXPECT_TRUE(hit("q_proj"));   // re.search finds it in the middle; re.match would not
  EXPECT_TRUE(hit("layers/\\d+/attn"));
  EXPECT_TRUE(hit("kernel$"));
  EXPECT_TRUE(hit("^params/.*kernel$"));
  EXPECT_TRUE(hit(""));
  EXPECT_TRUE(hit("(?i)Q_PROJ"));
  EXPECT_TRUE(hit("(?P<which>q|k|v)_proj"));
  EXPECT_TRUE(hit("\\(?=?q_proj"));  // an escaped parenthesis, not a lookahead
  EXPECT_TRUE(hit("[(?=]?q_proj"));  // a class, not a lookahead
  EXPECT_TRUE(hit("0{1,3}/attn"));
  EXPECT_TRUE(hit("(\\{,3})?kernel"));  // an escaped brace is literal in both
  EXPECT_TRUE(hit("kernel\\z"));
  EXPECT_FALSE(hit("^q_proj"));
  EXPECT_FALSE(hit("^attn"));
  EXPECT_FALSE(hit("bias"));
  EXPECT_FALSE(hit("kernel/$"));
}

TEST(Rules, NoMatchNamesTheLeaf) {
  PartitionRules r = rules_of({{"embedding", PartitionSpec::of({{"tp"}})}});
  EXPECT_ERROR(match_partition_rules(r, "params.lm_head.kernel", kBig), Code::kInvalidArgument,
               "no partition rule matches leaf 'params.lm_head.kernel'", "'params/lm_head/kernel'");
  EXPECT_ERROR(match_partition_rules(PartitionRules(), "w", {4}), Code::kInvalidArgument, "leaf 'w'");
  // A small leaf no rule names is still an error: eformer checks size after matching.
  EXPECT_ERROR(match_partition_rules(r, "params.norm.scale", {8}), Code::kInvalidArgument, "params.norm.scale");
}

TEST(Rules, ScalarsAreReplicatedWithoutARule) {
  PartitionRules r = rules_of({{"kernel", PartitionSpec::of({{"tp"}})}});
  auto s = match_partition_rules(r, "opt_state.count", {});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->spec, PartitionSpec{});
  EXPECT_EQ(s->rule_index, -1);
  // Even one a rule would match: eformer returns PartitionSpec() first.
  auto k = match_partition_rules(r, "kernel", {});
  EXPECT_EQ(k->rule_index, -1);
  EXPECT_EQ(k->spec, PartitionSpec{});
  // Not strict: scalars go through the rules like any leaf.
  RuleOptions loose{.min_size = 0, .strict = false};
  EXPECT_FALSE(match_partition_rules(r, "opt_state.count", {}, loose).ok());
  EXPECT_EQ(match_partition_rules(r, "kernel", {}, loose)->spec, PartitionSpec::of({{"tp"}}));
}

TEST(Rules, SmallLeavesAreReplicated) {
  PartitionRules r = rules_of({{".*", PartitionSpec::of({{"tp"}})}});
  auto small = match_partition_rules(r, "w", {128, 127});  // 16,256 < 16,384
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(small->small);
  EXPECT_EQ(small->rule_index, 0);
  EXPECT_EQ(small->spec, PartitionSpec{});
  auto at = match_partition_rules(r, "w", {128, 128});  // 16,384 is not below
  EXPECT_FALSE(at->small);
  EXPECT_EQ(at->spec, PartitionSpec::of({{"tp"}}));
  // eformer's match_partition_rules default min_size=0 shards everything.
  auto zero = match_partition_rules(r, "w", {2}, RuleOptions{.min_size = 0});
  EXPECT_EQ(zero->spec, PartitionSpec::of({{"tp"}}));
  EXPECT_TRUE(match_partition_rules(r, "w", {0, 5})->small);  // an empty leaf is small
  auto custom = match_partition_rules(r, "w", {100}, RuleOptions{.min_size = 101});
  EXPECT_TRUE(custom->small);
}

TEST(Rules, LongSpecsAreTrimmedAtTheEnd) {
  PartitionRules r = rules_of({{".*", PartitionSpec::of({{"fsdp"}, {"tp"}, {"sp"}})}});
  auto t = match_partition_rules(r, "w", kBig);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->trimmed);
  EXPECT_EQ(t->spec, PartitionSpec::of({{"fsdp"}, {"tp"}}));  // eformer: ps[: leaf.ndim]
  auto v = match_partition_rules(r, "v", {65536});
  EXPECT_EQ(v->spec, PartitionSpec::of({{"fsdp"}}));
  auto same = match_partition_rules(r, "x", {64, 64, 64});
  EXPECT_FALSE(same->trimmed);
  // Not strict: the spec is returned as written.
  auto loose = match_partition_rules(r, "w", kBig, RuleOptions{.strict = false});
  EXPECT_EQ(loose->spec.size(), 3u);
  EXPECT_FALSE(loose->trimmed);
}

TEST(Rules, InvalidRegexNamesTheRule) {
  EXPECT_ERROR(PartitionRules::compile({{"ok", {}}, {"(", {}}}), Code::kInvalidArgument, "rules[1]",
               "not valid for RE2", "missing )");
  EXPECT_ERROR(PartitionRules::compile({{"[z-a]", {}}}), Code::kInvalidArgument, "rules[0]", "range");
  EXPECT_ERROR(PartitionRules::compile({{"a**", {}}}), Code::kInvalidArgument, "rules[0]");
  EXPECT_ERROR(PartitionRules::compile({{"x{2000}", {}}}), Code::kInvalidArgument, "rules[0]", "repetition");
  EXPECT_ERROR(PartitionRules::compile({{"\xff", {}}}), Code::kInvalidArgument, "rules[0]", "UTF-8");
  EXPECT_ERROR(PartitionRules::compile({{"abc\\", {}}}), Code::kInvalidArgument, "rules[0]", "trailing");
}

TEST(Rules, PythonOnlyFeaturesAreRefusedByName) {
  struct Bad {
    const char* regex;
    const char* says;
  };
  const Bad cases[] = {
      {"q_proj(?=/kernel)", "lookahead"},
      {"(?!bias)kernel", "lookahead"},
      {"(?<=attn/)q_proj", "lookbehind"},
      {"(?<!mlp/)kernel", "lookbehind"},
      {"(a)\\1", "backreference \\1"},
      {"(?P<x>a)(?P=x)", "(?P=name)"},
      {"(?>kernel)", "atomic group"},
      {"(a)?(?(1)b|c)", "conditional"},
      {"kernel(?#the weights)", "comment"},
      {"(?x) kernel", "inline flag 'x'"},
      {"(?a)\\w+", "inline flag 'a'"},
      {"(?u:kernel)", "inline flag 'u'"},
      {"kernel\\Z", "\\Z"},
      {"layers/0{,3}", "{,n}"},
      {"layers/0{,}", "{,n}"},
      {"[[:alpha:]]+", "POSIX"},
      {"a*+", "repetition"},  // possessive: RE2's own message
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.regex);
    EXPECT_ERROR(PartitionRules::compile({{"fine", {}}, {"also", {}}, {b.regex, {}}}), Code::kInvalidArgument,
                 "rules[2]", b.says);
    if (std::string(b.says) != "repetition") {
      EXPECT_FALSE(check_python_regex(b.regex).ok());
    }
  }
  // Screen positions: inside a class or escaped, these are ordinary characters.
  for (const char* fine : {"[(?=]", "\\(?=", "[\\1]?", "\\\\Z", "[{,3}]", "\\{,3}", "a{1,3}", "[]{,3}]", "[^]]",
                           "(?i)x", "(?i:x)", "(?-i:x)", "(?s).", "(?P<n>x)", "(?:x)", "[[:]"})
    EXPECT_TRUE(check_python_regex(fine).ok()) << fine << ": " << check_python_regex(fine).to_string();
}

TEST(Rules, FromJsonFile) {
  Result<PartitionRules> r = PartitionRules::from_json(R"([
    ["attn/(q|k|v)_proj/kernel", ["fsdp", "tp"]],
    ["o_proj/kernel", ["tp", "fsdp"]],
    ["embed_tokens/embedding", [["fsdp", "sp"], "tp"]],
    ["norm", [null]],
    [".*", []]
  ])");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 5u);
  EXPECT_EQ(r->rules()[2].spec, PartitionSpec::of({{"fsdp", "sp"}, {"tp"}}));
  EXPECT_EQ(r->rules()[3].spec, PartitionSpec::of({{}}));
  EXPECT_EQ(r->rules()[4].spec, PartitionSpec{});
  EXPECT_EQ(match_partition_rules(*r, "params.layers.3.attn.k_proj.kernel", kBig)->rule_index, 0);
  EXPECT_EQ(match_partition_rules(*r, "params.lm_head.kernel", kBig)->rule_index, 4);
  EXPECT_EQ(PartitionRules::from_json("[]")->size(), 0u);
  // Copies share the compiled programs and stay usable.
  PartitionRules copy = *r;
  EXPECT_EQ(copy.first_match("o_proj/kernel"), 1u);
}

TEST(Rules, JsonErrorsNameTheLocation) {
  EXPECT_ERROR(PartitionRules::from_json("{}"), Code::kInvalidArgument, "rules: expected an array", "object");
  EXPECT_ERROR(PartitionRules::from_json("[1]"), Code::kInvalidArgument, "rules[0]: expected a [regex, spec] pair");
  EXPECT_ERROR(PartitionRules::from_json(R"([["a"]])"), Code::kInvalidArgument, "rules[0]:", "array of 1");
  EXPECT_ERROR(PartitionRules::from_json(R"([["a", [], 3]])"), Code::kInvalidArgument, "rules[0]:", "array of 3");
  EXPECT_ERROR(PartitionRules::from_json(R"([["a", []], [1, []]])"), Code::kInvalidArgument,
               "rules[1][0]: expected the regex as a string");
  EXPECT_ERROR(PartitionRules::from_json(R"([["a", "tp"]])"), Code::kInvalidArgument, "rules[0][1]: expected a "
               "PartitionSpec as an array");
  EXPECT_ERROR(PartitionRules::from_json(R"([["a", [null]], ["b", [null, ["x", 2]]]])"), Code::kInvalidArgument,
               "rules[1][1][1][1]:");
  EXPECT_ERROR(PartitionRules::from_json(R"([["a", [[["x"]]]]])"), Code::kInvalidArgument, "nested deeper than 4");
  EXPECT_ERROR(PartitionRules::from_json(R"J([["(?=x)", []]])J"), Code::kInvalidArgument, "rules[0]", "lookahead");
  EXPECT_ERROR(PartitionRules::from_json("[[\"a\", []],"), Code::kInvalidArgument, "rules: invalid JSON at byte");
  EXPECT_ERROR(PartitionRules::from_json(std::string(17 << 20, ' ')), Code::kInvalidArgument, "limit");
  std::string many = "[";
  for (int i = 0; i < 100001; ++i) many += i ? ",[\"a\",[]]" : "[\"a\",[]]";
  EXPECT_ERROR(PartitionRules::from_json(many + "]"), Code::kInvalidArgument, "100001 rules");
}

TEST(Rules, JsonNeverCrashesOnRandomInput) {
  std::mt19937 rng(99);
  const std::string alphabet = "[]{}\",:nul a(?=)\\*+.1{}\xff";
  const std::string valid = R"([["attn/(q|k)_proj", ["fsdp", ["dp", "tp"]]], [".*", []]])";
  for (int i = 0; i < 20000; ++i) {
    std::string s = valid;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) s[rng() % s.size()] = alphabet[rng() % alphabet.size()];
    Result<PartitionRules> r = PartitionRules::from_json(s);
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind("rules", 0), 0u) << r.status().message();
    }
  }
}

TEST(Rules, MatchingIsThreadSafe) {
  PartitionRules r = rules_of({{"q_proj", PartitionSpec::of({{"tp"}})}, {".*", PartitionSpec{}}});
  std::vector<std::thread> threads;
  std::vector<int> hits(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) hits[t] += r.first_match(i % 2 ? "a/q_proj/k" : "a/b") == 0u;
    });
  for (auto& th : threads) th.join();
  for (int h : hits) EXPECT_EQ(h, 1000);
}

// ---- Sharding trees --------------------------------------------------------------

Index sample_index() {
  Index idx;
  idx.prefixes = {
      {"model",
       {{"params.embed.embedding", DType::kBFloat16, {1024, 512}, {}},
        {"params.layers.0.attn.q_proj.kernel", DType::kBFloat16, {512, 512}, {}},
        {"params.layers.0.norm.scale", DType::kFloat32, {512}, {}}}},
      {"tx", {{"count", DType::kInt32, {}, {}}, {"mu.params.layers.0.attn.q_proj.kernel", DType::kFloat32, {512, 512}, {}}}},
  };
  return idx;
}

TEST(ShardingTree, FromIndexWithRules) {
  Mesh mesh = mesh_of("dp=2,tp=4");
  PartitionRules rules = rules_of({{"embedding", PartitionSpec::of({{"tp"}, {"dp"}})},
                                   {"q_proj/kernel", PartitionSpec::of({{"dp"}, {"tp"}, {}})},
                                   {".*", PartitionSpec{}}});
  Result<ShardingTree> t = sharding_tree_from_index(sample_index(), mesh, rules);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->leaves.size(), 5u);
  EXPECT_EQ(t->mesh, mesh);
  EXPECT_EQ(t->leaves[0], (LeafSharding{"model", "params.embed.embedding", {1024, 512},
                                        PartitionSpec::of({{"tp"}, {"dp"}}), 0}));
  EXPECT_EQ(t->leaves[1].spec, PartitionSpec::of({{"dp"}, {"tp"}}));  // trimmed to rank 2
  EXPECT_EQ(t->leaves[2].spec, PartitionSpec{});                       // small
  EXPECT_EQ(t->leaves[2].rule_index, 2);
  EXPECT_EQ(t->leaves[3].rule_index, -1);  // scalar
  const LeafSharding* mu = t->find("tx", "mu.params.layers.0.attn.q_proj.kernel");
  ASSERT_NE(mu, nullptr);
  EXPECT_EQ(mu->rule_index, 1);  // search finds the rule inside the optimizer path
  EXPECT_EQ(t->find("tx", "nope"), nullptr);
  auto boxes = unique_shards(t->sharding_of(*mu), mu->shape);
  ASSERT_TRUE(boxes.ok());
  EXPECT_EQ(boxes->size(), 8u);
}

TEST(ShardingTree, ErrorsNameTheLeaf) {
  Mesh mesh = mesh_of("dp=2,tp=3");
  EXPECT_ERROR(sharding_tree_from_index(sample_index(), mesh, rules_of({{"embedding", PartitionSpec{}}})),
               Code::kInvalidArgument, "prefix 'model'", "leaf 'params.layers.0.attn.q_proj.kernel'");
  EXPECT_ERROR(sharding_tree_from_index(sample_index(), mesh, rules_of({{".*", PartitionSpec::of({{"zz"}})}})),
               Code::kInvalidArgument, "prefix 'model' leaf 'params.embed.embedding'", "axis 'zz'");
  // 512 split 3 ways: refused as JAX would, accepted with XLA's padding.
  PartitionRules tp = rules_of({{"q_proj", PartitionSpec::of({{}, {"tp"}})}, {".*", PartitionSpec{}}});
  EXPECT_ERROR(sharding_tree_from_index(sample_index(), mesh, tp), Code::kInvalidArgument,
               "leaf 'params.layers.0.attn.q_proj.kernel'", "dimension 1 of size 512", "split 3 ways");
  EXPECT_TRUE(sharding_tree_from_index(sample_index(), mesh, tp, {}, Uneven::kPad).ok());
  // Not strict: an over-long spec reaches validate_sharding, which refuses it.
  PartitionRules longer = rules_of({{".*", PartitionSpec::of({{}, {}, {}})}});
  EXPECT_ERROR(sharding_tree_from_index(sample_index(), mesh, longer, RuleOptions{.strict = false}),
               Code::kInvalidArgument, "leaf 'params.embed.embedding'", "3 entries");
  EXPECT_ERROR(sharding_tree_from_index(sample_index(), Mesh(), tp), Code::kInvalidArgument, "no devices");
}

TEST(ShardingTree, DefaultSpec) {
  Mesh mesh = mesh_of("dp=2,tp=4");
  Result<ShardingTree> all = sharding_tree_from_index(sample_index(), mesh, PartitionSpec{});
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  for (const LeafSharding& l : all->leaves) {
    EXPECT_EQ(l.spec, PartitionSpec{});
    EXPECT_EQ(l.rule_index, -1);
  }
  // Applied as written: the scalar cannot take a one-entry spec.
  EXPECT_ERROR(sharding_tree_from_index(sample_index(), mesh, PartitionSpec::of({{"dp"}})), Code::kInvalidArgument,
               "prefix 'tx' leaf 'count'", "rank 0");
  std::vector<LeafSpec> leaves = {{"m", "a", DType::kFloat32, {8, 8}}, {"m", "b", DType::kFloat32, {16}}};
  Result<ShardingTree> dp = sharding_tree(leaves, mesh, PartitionSpec::of({{"dp"}}));
  ASSERT_TRUE(dp.ok());
  EXPECT_EQ(dp->leaves[1].spec, PartitionSpec::of({{"dp"}}));
}

}  // namespace
}  // namespace ckptio
