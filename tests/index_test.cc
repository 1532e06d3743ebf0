// The index format: round trips of every shape the writer produces, and one
// test per rejection of the strict parser (docs/format.md is the contract).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ckptio/index.h"
#include "src/index/index_readers.h"
#include "src/util/printable.h"

namespace ckptio {
namespace {

using OJson = nlohmann::ordered_json;

constexpr const char* kFile = "data-0123456789abcdef-0.bin";

// ---- Building indexes ---------------------------------------------------------

// Boxes that cut `shape` into parts[d] near-equal pieces along each dimension.
std::vector<Box> grid(const Shape& shape, const std::vector<int64_t>& parts) {
  std::vector<Box> boxes(1);
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : boxes)
      for (int64_t p = 0; p < parts[d]; ++p) {
        Box c = b;
        c.start.push_back(shape[d] * p / parts[d]);
        c.stop.push_back(shape[d] * (p + 1) / parts[d]);
        next.push_back(c);
      }
    boxes = std::move(next);
  }
  return boxes;
}

uint64_t volume(const Box& b) {
  uint64_t n = 1;
  for (size_t d = 0; d < b.rank(); ++d) n *= b.stop[d] - b.start[d];
  return n;
}

// Lays leaves out back to back in data files, as the writer does.
class Builder {
 public:
  Builder& leaf(const std::string& prefix, const std::string& path, DType dtype, Shape shape,
                std::vector<Box> boxes = {}, const std::string& file = kFile) {
    if (boxes.empty()) boxes.push_back(Box::whole(shape));
    PrefixRecord* p = nullptr;
    for (auto& q : index_.prefixes)
      if (q.name == prefix) p = &q;
    if (!p) p = &index_.prefixes.emplace_back(PrefixRecord{prefix, {}});
    LeafRecord l{path, dtype, std::move(shape), {}};
    uint64_t& end = file_end(file);
    for (Box& b : boxes) {
      ShardRecord s;
      s.length = volume(b) * dtype_size(dtype);
      s.box = std::move(b);
      s.file = file;
      s.offset = end;
      s.crc32c = s.length ? static_cast<uint32_t>(end * 2654435761u + s.length) : 0;  // (an empty shard's is 0)
      end += s.length;
      l.shards.push_back(std::move(s));
    }
    p->leaves.push_back(std::move(l));
    return *this;
  }
  Builder& prefix(const std::string& name) {
    index_.prefixes.push_back(PrefixRecord{name, {}});
    return *this;
  }
  Builder& file(const std::string& name) {
    file_end(name);
    return *this;
  }
  Builder& metadata(const std::string& m) {
    index_.metadata_json = m;
    return *this;
  }
  Index build() const {
    Index x = index_;
    for (const auto& [name, size] : files_) x.files.push_back({name, size});
    return x;
  }

 private:
  uint64_t& file_end(const std::string& name) {
    for (auto& f : files_)
      if (f.first == name) return f.second;
    return files_.emplace_back(name, 0).second;
  }
  Index index_ = [] {
    Index x;
    x.step = 1200;
    x.created_unix_ns = 1795394400123456789;
    x.committed_unix_ns = 1795394401987654321;
    return x;
  }();
  std::vector<std::pair<std::string, uint64_t>> files_;
};

Index sample() {
  return Builder()
      .leaf("model", "params.layers.0.attn.q_proj.kernel", DType::kBFloat16, {4, 6}, grid({4, 6}, {2, 2}))
      .leaf("model", "params.bias", DType::kFloat32, {6})
      .leaf("tx", "count", DType::kInt64, {})
      .metadata(R"({"data_pos":123})")
      .build();
}

// The sample's JSON with `edit` applied (through nlohmann, keeping key order).
std::string edited(const std::function<void(OJson&)>& edit, const Index& x = sample()) {
  OJson j = OJson::parse(serialize_index(x));
  edit(j);
  return j.dump();
}

OJson& shard0(OJson& j) { return j["prefixes"]["model"][0]["shards"][0]; }

// ---- Assertions -----------------------------------------------------------------

::testing::AssertionResult RoundTrips(const Index& x) {
  const std::string text = serialize_index(x);
  auto r = parse_index(text);
  if (!r.ok()) return ::testing::AssertionFailure() << r.status().to_string() << "\n" << text;
  if (!(*r == x)) return ::testing::AssertionFailure() << "parsed index differs:\n" << text;
  if (serialize_index(*r) != text) return ::testing::AssertionFailure() << "re-serialization differs";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Rejects(std::string_view text, const std::string& needle,
                                   const IndexLimits& limits = {}) {
  auto r = parse_index(text, limits);
  if (r.ok()) return ::testing::AssertionFailure() << "accepted";
  if (r.status().code() != Code::kDataLoss)
    return ::testing::AssertionFailure() << "code " << code_name(r.status().code()) << ": "
                                         << r.status().message();
  if (r.status().message().find(needle) == std::string::npos)
    return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": "
                                         << r.status().message();
  return ::testing::AssertionSuccess() << r.status().message();
}

// ---- Round trips ------------------------------------------------------------------

TEST(IndexRoundTrip, Sample) { EXPECT_TRUE(RoundTrips(sample())); }

TEST(IndexRoundTrip, EveryDType) {
  Builder b;
  for (int t = 0; t < kNumDTypes; ++t) {
    const DType dt = static_cast<DType>(t);
    b.leaf("model", "leaf." + std::string(dtype_name(dt)), dt, {3, 5});
  }
  const Index x = b.build();
  ASSERT_TRUE(RoundTrips(x));
  auto r = parse_index(serialize_index(x));
  ASSERT_TRUE(r.ok());
  for (int t = 0; t < kNumDTypes; ++t) {
    EXPECT_EQ(r->prefixes[0].leaves[t].dtype, static_cast<DType>(t));
    EXPECT_EQ(r->prefixes[0].leaves[t].num_bytes(), 15 * dtype_size(static_cast<DType>(t)));
  }
}

TEST(IndexRoundTrip, ScalarLeaf) {
  Index x = Builder().leaf("model", "step", DType::kInt32, {}).build();
  ASSERT_EQ(x.prefixes[0].leaves[0].shards[0].box, (Box{{}, {}}));
  EXPECT_TRUE(RoundTrips(x));
  EXPECT_EQ(x.total_bytes(), 4u);
}

TEST(IndexRoundTrip, ZeroSizeDims) {
  Index x = Builder()
                .leaf("model", "empty0", DType::kFloat32, {0})
                .leaf("model", "empty1", DType::kFloat32, {3, 0, 2})
                .leaf("model", "empty2", DType::kFloat32, {0, 5}, grid({0, 5}, {1, 5}))
                .build();
  EXPECT_TRUE(RoundTrips(x));
  EXPECT_EQ(x.total_bytes(), 0u);
}

TEST(IndexRoundTrip, ZeroSizeLeafWithoutShards) {
  Index x = Builder().leaf("model", "e", DType::kFloat32, {0, 4}).build();
  x.prefixes[0].leaves[0].shards.clear();
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexRoundTrip, EmptyBoxShardsInsideANonEmptyLeaf) {
  // Empty boxes cover nothing and are allowed anywhere inside the shape.
  Index x = Builder().leaf("model", "w", DType::kFloat32, {4, 4}, {Box::whole({4, 4}), Box{{2, 1}, {2, 4}}}).build();
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexRoundTrip, Ranks1To5) {
  Builder b;
  Shape shape;
  for (int r = 1; r <= 5; ++r) {
    shape.push_back(r + 1);
    b.leaf("model", "rank" + std::to_string(r), DType::kFloat16, shape);
  }
  EXPECT_TRUE(RoundTrips(b.build()));
}

TEST(IndexRoundTrip, ManyShardsPerLeaf) {
  Index x = Builder()
                .leaf("model", "grid4x4", DType::kFloat32, {8, 12}, grid({8, 12}, {4, 4}))
                .leaf("model", "uneven", DType::kFloat32, {7, 5}, grid({7, 5}, {3, 2}))
                .leaf("model", "rows", DType::kUInt8, {64, 3}, grid({64, 3}, {64, 1}))
                .leaf("model", "cube", DType::kInt16, {6, 6, 6}, grid({6, 6, 6}, {3, 3, 3}))
                .leaf("model", "hyper", DType::kInt8, {4, 4, 4, 4, 4}, grid({4, 4, 4, 4, 4}, {2, 2, 2, 2, 2}))
                .build();
  EXPECT_EQ(x.prefixes[0].leaves[0].shards.size(), 16u);
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexRoundTrip, MultiplePrefixesKeepTheirOrder) {
  Index x = Builder()
                .leaf("tx", "mu.w", DType::kFloat32, {2})
                .leaf("model", "w", DType::kFloat32, {2})
                .prefix("empty")
                .leaf("zeta/ema", "w", DType::kFloat32, {2})
                .build();
  ASSERT_TRUE(RoundTrips(x));
  auto r = parse_index(serialize_index(x));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->prefixes.size(), 4u);
  EXPECT_EQ(r->prefixes[0].name, "tx");
  EXPECT_EQ(r->prefixes[1].name, "model");
  EXPECT_EQ(r->prefixes[2].name, "empty");
}

TEST(IndexRoundTrip, MultipleDataFiles) {
  Index x = Builder()
                .leaf("model", "a", DType::kFloat32, {4, 4}, grid({4, 4}, {2, 1}), "data-x-0.bin")
                .leaf("model", "b", DType::kFloat64, {3}, {}, "data-x-1.bin")
                .leaf("tx", "c", DType::kFloat64, {3}, {}, "data-x-0.bin")
                .file("data-x-2.bin")  // listed, unreferenced, empty
                .build();
  ASSERT_EQ(x.files.size(), 3u);
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexRoundTrip, EmptyIndex) {
  Index x = Builder().build();
  EXPECT_TRUE(RoundTrips(x));
  EXPECT_EQ(x.total_bytes(), 0u);
}

TEST(IndexRoundTrip, MetadataNestedAndUnicode) {
  const std::string meta =
      R"({"data_pos":123,"rng":[1,2,{"k":null}],"name":"模型 ✓ \"q\" \\ é","emoji":"😀",)"
      R"("nested":{"z":1,"a":[true,false,-3,1.5,1e300]},"esc":"\u0001\n"})";
  auto canonical = OJson::parse(meta).dump();
  Index x = Builder().leaf("model", "层.权重", DType::kFloat32, {2}).metadata(canonical).build();
  EXPECT_TRUE(RoundTrips(x));
  auto r = parse_index(serialize_index(x));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(OJson::parse(r->metadata_json), OJson::parse(meta));
  // Key order is kept ("z" before "a").
  EXPECT_LT(r->metadata_json.find("\"z\""), r->metadata_json.find("\"a\""));
}

TEST(IndexRoundTrip, MetadataIsStoredCanonically) {
  Index x = sample();
  x.metadata_json = "{ \"b\" : 1 ,\n \"a\" : [ 1 , 2 ] }";
  auto r = parse_index(serialize_index(x));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata_json, R"({"b":1,"a":[1,2]})");
}

TEST(IndexRoundTrip, ExtremeIntegers) {
  Index x = Builder().leaf("model", "w", DType::kUInt8, {int64_t{1} << 62}).build();
  x.step = INT64_MAX;
  x.created_unix_ns = 0;
  x.committed_unix_ns = INT64_MAX;
  x.prefixes[0].leaves[0].shards[0].crc32c = UINT32_MAX;
  x.files[0].size = UINT64_MAX;
  x.prefixes[0].leaves[0].shards[0].offset = UINT64_MAX - (uint64_t{1} << 62);
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexRoundTrip, UnknownFieldsAreIgnored) {
  const std::string text = edited([](OJson& j) {
    j["future_top"] = {{"x", 1}};
    j["files"][0]["future_file"] = "y";
    j["prefixes"]["model"][0]["future_leaf"] = OJson::array({1, 2});
    shard0(j)["future_shard"] = nullptr;
    shard0(j)["box"]["future_box"] = 3;
  });
  auto r = parse_index(text);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(*r == sample());
}

TEST(IndexRoundTrip, TimesAreInformationalOnRead) {
  auto r = parse_index(edited([](OJson& j) {
    j.erase("created_at");
    j["committed_at"] = "not a time";
  }));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->committed_unix_ns, sample().committed_unix_ns);
}

TEST(IndexRoundTrip, NegativeZeroIsZero) {
  std::string text = serialize_index(sample());
  const std::string from = "\"offset\": 0,";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"offset\": -0,");
  auto r = parse_index(text);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prefixes[0].leaves[0].shards[0].offset, 0u);
}

// ---- The two readers ------------------------------------------------------------
// parse_index = the fast reader when it takes the text, else the strict one.

// The fast reader takes `text`, and gives what the strict reader gives.
::testing::AssertionResult FastReads(const std::string& text) {
  Index fast;
  if (!index_readers::read_index_fast(text, {}, &fast))
    return ::testing::AssertionFailure() << "the fast reader refused:\n" << text;
  auto strict = index_readers::read_index_strict(text);
  if (!strict.ok()) return ::testing::AssertionFailure() << "strict: " << strict.status().to_string();
  if (!(fast == *strict)) return ::testing::AssertionFailure() << "the readers differ on:\n" << text;
  return ::testing::AssertionSuccess();
}

// The fast reader leaves `text` to the strict reader, and parse_index gives
// exactly what the strict reader gives (the same Index or the same error).
::testing::AssertionResult LeftToStrict(const std::string& text) {
  Index fast;
  if (index_readers::read_index_fast(text, {}, &fast))
    return ::testing::AssertionFailure() << "the fast reader took:\n" << text;
  auto strict = index_readers::read_index_strict(text);
  auto r = parse_index(text);
  if (r.ok() != strict.ok() || (r.ok() && !(*r == *strict)) ||
      (!r.ok() && r.status().to_string() != strict.status().to_string()))
    return ::testing::AssertionFailure() << "parse_index differs from the strict reader on:\n" << text;
  return ::testing::AssertionSuccess() << (strict.ok() ? "accepted" : strict.status().to_string());
}

TEST(IndexReaders, TheFastReaderTakesWhatTheWriterWrites) {
  EXPECT_TRUE(FastReads(serialize_index(sample())));
  EXPECT_TRUE(FastReads(serialize_index(Index{})));
  Builder b;
  for (int i = 0; i < 200; ++i)
    b.leaf(i % 3 ? "model" : "tx", "p." + std::to_string(i), DType::kFloat16, {3, 5}, grid({3, 5}, {3, 1}),
           "data-0123456789abcdef-" + std::to_string(i % 4) + ".bin");
  EXPECT_TRUE(FastReads(serialize_index(b.metadata(R"({"a":[1,2.5,"x\n",null,{"b":true}],"c":-1})").build())));
  // Compact and re-spaced forms, members in another order.
  EXPECT_TRUE(FastReads(OJson::parse(serialize_index(sample())).dump()));
  EXPECT_TRUE(FastReads(OJson::parse(serialize_index(sample())).dump(1, '\t')));
  EXPECT_TRUE(FastReads(edited([](OJson& j) {
    OJson moved = j["format"];
    j.erase("format");
    j["format"] = moved;
    j.erase("created_at");
  })));
}

TEST(IndexReaders, AnythingElseIsLeftToTheStrictReader) {
  const std::string text = serialize_index(sample());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  // Accepted by the strict reader.
  EXPECT_TRUE(LeftToStrict(replaced("\"params.bias\"", "\"params.\\u0062ias\"")));  // an escape
  EXPECT_TRUE(LeftToStrict(replaced("\"params.bias\"", "\"params.bïas\"")));        // non-ASCII
  EXPECT_TRUE(LeftToStrict(replaced("\"offset\": 0,", "\"offset\": -0,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"step\": 1200,", "\"step\": 1200, \"future\": [1],")));
  EXPECT_TRUE(LeftToStrict(replaced("\"model\": [", "\"mod\\u0065l\": [")));
  EXPECT_TRUE(LeftToStrict("\xEF\xBB\xBF" + text));  // a byte order mark
  // Refused by it (parse_index gives its error).
  EXPECT_TRUE(LeftToStrict(replaced("\"offset\": 0,", "\"offset\": 00,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"offset\": 0,", "\"offset\": 0.0,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"offset\": 0,", "\"offset\": 0e0,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"offset\": 0,", "\"offset\": 18446744073709551616,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"step\": 1200,", "\"step\": 1200, \"step\": 1200,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"step\": 1200,", "\"step\": 9223372036854775808,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"format\": \"ckptio\",", "")));
  EXPECT_TRUE(LeftToStrict(replaced("\"created_at\": \"", "\"created_at\": \"\x01")));
  EXPECT_TRUE(LeftToStrict(replaced("\"params.bias\"", "\"\"")));
  EXPECT_TRUE(LeftToStrict(replaced("\"tx\": [", "\"model\": [")));     // a duplicate prefix
  EXPECT_TRUE(LeftToStrict(replaced("\"metadata\": {", "\"metadata\": {\"a\":1,\"a\":2,")));
  EXPECT_TRUE(LeftToStrict(replaced("\"metadata\": {", "\"metadata\": {\"a\":[1,}")));
  EXPECT_TRUE(LeftToStrict(replaced("\"metadata\": {", "\"metadata\": [{")));
  EXPECT_TRUE(LeftToStrict(text + "x"));
  EXPECT_TRUE(LeftToStrict(text + "{}"));
  EXPECT_TRUE(LeftToStrict(text.substr(0, text.size() - 3)));
  EXPECT_TRUE(LeftToStrict(replaced("\"length\": 24,", "\"length\": 25,")));
}

// 40 leaves in two prefixes, and '{"path"' in the metadata too: documents
// for split points anywhere.
std::string forty_leaves_and_paths_in_metadata() {
  Builder b;
  for (int i = 0; i < 40; ++i)
    b.leaf(i % 3 ? "model" : "tx", "p." + std::to_string(i), DType::kFloat16, {3, 5}, grid({3, 5}, {3, 1}),
           "data-0123456789abcdef-" + std::to_string(i % 2) + ".bin");
  return serialize_index(b.metadata(R"({"x":[{"path":1},"{\"path\""]})").build());
}

// Over 1 MiB: parse_index splits it by itself.
std::string eight_thousand_leaves() {
  Builder big;
  for (int i = 0; i < 8000; ++i)
    big.leaf("model", "params.layers." + std::to_string(i) + ".kernel", DType::kFloat32, {4, 4},
             grid({4, 4}, {1, 1}), "data-0123456789abcdef-0.bin");
  return serialize_index(big.build());
}

// Two threads (a helper reading leaves from a split point) give exactly what
// one thread gives, wherever the split point lies: at a leaf, inside one, in
// metadata, in another prefix, in the files, past the end; on valid texts and
// on texts one of the two would refuse.
TEST(IndexReaders, ASplitReadGivesTheOneThreadResult) {
  const std::string valid = forty_leaves_and_paths_in_metadata();
  std::vector<std::string> texts = {valid};
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = valid;
    const size_t at = t.rfind(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  texts.push_back(replaced("\"p.38\"", "\"p.1\""));       // a duplicate path, late
  texts.push_back(replaced("\"length\": 10,", "\"length\": 11,"));  // a bad leaf, late
  texts.push_back(replaced("\n      ]}\n    ]", "\n      ]},\n    ]"));  // a trailing comma
  texts.push_back(replaced("\"dtype\": \"float16\"", "\"dtype\": \"float17\""));
  size_t splits = 0, taken = 0;
  for (const std::string& text : texts) {
    Index one;
    const bool one_ok = index_readers::read_index_fast(text, {}, &one, std::string_view::npos);
    for (size_t at = 0; at <= text.size() + 1; ++at) {
      if (at < text.size() && text[at] != '{' && at % 97 != 0) continue;  // every '{', and other bytes
      Index two;
      const bool two_ok = index_readers::read_index_fast(text, {}, &two, at);
      ASSERT_EQ(two_ok, one_ok) << "split at " << at << " of:\n" << text;
      if (one_ok) ASSERT_TRUE(two == one) << "split at " << at;
      ++splits;
      taken += one_ok;
    }
  }
  EXPECT_GT(splits, 5 * 60u);
  EXPECT_GT(taken, 60u);
  // The count limit across the two runs: exactly at it, and one short.
  Index one;
  IndexLimits limits;
  limits.max_leaves = 40;
  const size_t mid = valid.find("{\"path\": \"p.20\"");
  ASSERT_NE(mid, std::string::npos);
  EXPECT_TRUE(index_readers::read_index_fast(valid, limits, &one, mid));
  limits.max_leaves = 39;
  EXPECT_FALSE(index_readers::read_index_fast(valid, limits, &one, mid));
  // parse_index splits a large text by itself, and gives the same Index.
  const std::string large = eight_thousand_leaves();
  ASSERT_GT(large.size(), size_t{1} << 20);
  Index alone;
  ASSERT_TRUE(index_readers::read_index_fast(large, {}, &alone, std::string_view::npos));
  auto parsed = parse_index(large);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(*parsed == alone);
}

// parse_index_arriving reads the first part of a text while the rest is
// brought in (on the helper thread). Whatever the split point and the part
// already in, the result is parse_index's and the rest is brought in exactly
// once. Nothing of it may be read before: here it is garbage until then, and
// the TSan build reports a read of it as a race with its arrival. A text whose root closes inside the first part (its split point in
// the metadata, never reached) still has what follows checked.
TEST(IndexReaders, ATextReadWhileItArrivesGivesTheWholeTextResult) {
  const std::string valid = forty_leaves_and_paths_in_metadata();
  const std::vector<std::string> texts = {
      valid,
      valid + "  \n",                                                       // taken
      valid + " x",                                                          // refused
      std::string(valid).replace(valid.rfind("\"p.38\""), 6, "\"p.1\""),  // a duplicate path, late
  };
  size_t reads = 0, taken = 0;
  for (const std::string& text : texts) {
    auto whole = parse_index(text);
    std::vector<size_t> splits = {std::string::npos, text.find("{\"path\":1}"), text.find("{\"path\": \"p.20\"")};
    for (size_t at = 0; at < text.size(); at += 211) splits.push_back(at);
    for (size_t loaded : {size_t{0}, text.size() / 3, text.size() / 2, valid.size(), text.size() - 1, text.size()}) {
      loaded = std::min(loaded, text.size());
      for (size_t split : splits) {
        std::string arriving = text.substr(0, loaded) + std::string(text.size() - loaded, '}');
        int calls = 0;
        const std::function<Status()> rest = [&] {
          ++calls;
          arriving.replace(loaded, text.size() - loaded, text.substr(loaded));
          return Status::OK();
        };
        auto got = index_readers::parse_index_arriving(
            arriving, loaded, rest, {}, split == std::string::npos ? std::nullopt : std::optional<size_t>(split));
        ASSERT_EQ(calls, 1) << "loaded " << loaded << ", split " << split;
        ASSERT_EQ(got.ok(), whole.ok()) << "loaded " << loaded << ", split " << split << ":\n" << text;
        if (whole.ok()) ASSERT_TRUE(*got == *whole) << "loaded " << loaded << ", split " << split;
        else EXPECT_EQ(got.status().to_string(), whole.status().to_string());
        ++reads;
        taken += got.ok();
      }
    }
  }
  EXPECT_GT(reads, 4 * 6 * 10u);
  EXPECT_GT(taken, 2 * 6 * 10u);
  // The error of bringing in the rest is the result.
  const std::function<Status()> fails = [] { return io_error("read index: the disk is gone"); };
  auto got = index_readers::parse_index_arriving(valid, valid.size() / 2, fails);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kIOError);
  // A large text: split by itself in the first part, same Index.
  const std::string large = eight_thousand_leaves();
  ASSERT_GT(large.size(), size_t{1} << 20);
  const size_t first = large.size() / 2 + 4096;
  std::string arriving = large.substr(0, first) + std::string(large.size() - first, ' ');
  const std::function<Status()> rest = [&] {
    arriving.replace(first, large.size() - first, large.substr(first));
    return Status::OK();
  };
  auto parsed = index_readers::parse_index_arriving(arriving, first, rest);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(*parsed == *parse_index(large));
}

// Under a sanitizer (ASan ~10x, TSan ~15x slower) the large-input tests
// below keep every case but repeat less: the Release suite runs them whole.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CKPTIO_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define CKPTIO_UNDER_SANITIZER 1
#endif
#endif
#ifdef CKPTIO_UNDER_SANITIZER
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif

// Many leaves are checked for duplicate paths by two threads, each over
// half of the hash space: the first duplicate in order is still the one
// reported, with the first leaf of its path, wherever the two fall.
TEST(IndexReject, DuplicateLeafPathAmongManyIsTheFirst) {
  Builder b;
  for (int i = 0; i < 40000; ++i)
    b.leaf("model", "params.layers." + std::to_string(i) + ".kernel", DType::kFloat32, {2}, grid({2}, {1}),
           "data-0123456789abcdef-0.bin");
  const Index base = b.build();
  for (int k = 0; k < 12; k += kUnderSanitizer ? 4 : 1) {  // under a sanitizer: 0, 4, 8
    Index x = base;
    auto& leaves = x.prefixes[0].leaves;
    const size_t first = 20000 + 97 * k, second = 30000 + 13 * k;
    leaves[second].path = leaves[k].path;          // a later duplicate of leaf k
    leaves[first].path = leaves[100 + k].path;     // the first duplicate in order
    auto parsed = parse_index(serialize_index(x));
    ASSERT_FALSE(parsed.ok());
    EXPECT_NE(parsed.status().message().find("prefixes.model[" + std::to_string(first) +
                                             "].path: duplicate leaf path \"" + leaves[first].path +
                                             "\" (also at [" + std::to_string(100 + k) + "])"),
              std::string::npos)
        << parsed.status().to_string();
  }
}

// The fast reader checks shard -> file references by runs of shards that
// name one file, gathered by both its threads as they read: a bad reference
// anywhere in a large index (in either thread's half, at a run's start or
// inside one) is refused, with the strict reader's message.
TEST(IndexReject, ShardFileProblemsAmongManyAreNamed) {
  Builder b;
  for (int i = 0; i < 40000; ++i)
    b.leaf("model", "params.layers." + std::to_string(i) + ".kernel", DType::kFloat32, {2}, grid({2}, {1}),
           i % 3000 < 1500 ? "data-a.bin" : "data-b.bin");
  const Index base = b.build();
  ASSERT_TRUE(parse_index(serialize_index(base)).ok());
  uint64_t size_of[2] = {base.files[0].size, base.files[1].size};
  ASSERT_EQ(base.files[0].name, "data-a.bin");
  const size_t positions[] = {0, 1499, 1500, 2000, 21000, 39999};
  for (int i = 0; i < 6; ++i) {
    const size_t at = positions[i];
    const std::string where = "prefixes.model[" + std::to_string(at) + "].shards[0]";
    const uint64_t size = size_of[at % 3000 < 1500 ? 0 : 1];
    auto expect_refused = [&](const Index& x, const std::string& what) {
      auto parsed = parse_index(serialize_index(x));
      ASSERT_FALSE(parsed.ok()) << "leaf " << at << ": " << what;
      EXPECT_NE(parsed.status().message().find(where + what), std::string::npos) << parsed.status().to_string();
    };
    // Under a sanitizer each position takes one of the three problems in
    // turn (every position and every problem still seen once or more).
    const int only = kUnderSanitizer ? i % 3 : -1;
    Index x = base;
    if (only < 0 || only == 0) {
      x.prefixes[0].leaves[at].shards[0].file = "data-c.bin";
      expect_refused(x, ".file: \"data-c.bin\" is not listed in \"files\"");
    }
    if (only < 0 || only == 1) {
      x = base;
      x.prefixes[0].leaves[at].shards[0].offset = size - 4;  // [size - 4, size + 4)
      expect_refused(x, ".offset: bytes [" + std::to_string(size - 4) + ", " + std::to_string(size + 4) + ") lie beyond");
    }
    if (only < 0 || only == 2) {
      x = base;
      x.prefixes[0].leaves[at].shards[0].offset = UINT64_MAX - 3;
      expect_refused(x, ".offset: offset + length overflows 64 bits");
    }
  }
}

TEST(IndexFormat, GoldenText) {
  Index x = Builder().leaf("model", "w", DType::kBFloat16, {2, 2}, grid({2, 2}, {2, 1})).prefix("tx").build();
  x.metadata_json = R"({"a":1})";
  x.prefixes[0].leaves[0].shards[0].crc32c = 7;
  x.prefixes[0].leaves[0].shards[1].crc32c = 8;
  const std::string expect = R"({
  "format": "ckptio",
  "version": 1,
  "step": 1200,
  "created_at": "2026-11-23T00:40:00.123456789Z",
  "committed_at": "2026-11-23T00:40:01.987654321Z",
  "created_unix_ns": 1795394400123456789,
  "committed_unix_ns": 1795394401987654321,
  "metadata": {"a":1},
  "files": [
    {"name": "data-0123456789abcdef-0.bin", "size": 8}
  ],
  "prefixes": {
    "model": [
      {"path": "w", "dtype": "bfloat16", "shape": [2, 2], "shards": [
        {"box": {"start": [0, 0], "stop": [1, 2]}, "file": "data-0123456789abcdef-0.bin", "offset": 0, "length": 4, "crc32c": 7},
        {"box": {"start": [1, 0], "stop": [2, 2]}, "file": "data-0123456789abcdef-0.bin", "offset": 4, "length": 4, "crc32c": 8}
      ]}
    ],
    "tx": []
  }
}
)";
  EXPECT_EQ(serialize_index(x), expect);
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexFormat, Rfc3339Times) {
  Index x = Builder().build();
  x.created_unix_ns = 0;
  x.committed_unix_ns = 951782400000000001;  // 2000-02-29 (leap day)
  OJson j = OJson::parse(serialize_index(x));
  EXPECT_EQ(j["created_at"], "1970-01-01T00:00:00.000000000Z");
  EXPECT_EQ(j["committed_at"], "2000-02-29T00:00:00.000000001Z");
}

TEST(IndexFormat, NumBytesAndTotalBytes) {
  Index x = sample();
  EXPECT_EQ(x.prefixes[0].leaves[0].num_bytes(), 4u * 6 * 2);
  EXPECT_EQ(x.total_bytes(), 4u * 6 * 2 + 6 * 4 + 8);
  LeafRecord huge{"h", DType::kFloat64, {int64_t{1} << 40, int64_t{1} << 40}, {}};
  EXPECT_EQ(huge.num_bytes(), UINT64_MAX);  // saturates
}

// ---- Names --------------------------------------------------------------------------

TEST(SafeRelativeName, AcceptsPlainAndNestedNames) {
  for (std::string_view n : {"a", "data-ab-0.bin", "model", "a/b", "a/b/c.bin", "a..b", "..a", "a.", "x y", "模型"})
    EXPECT_TRUE(is_safe_relative_name(n)) << n;
}

TEST(SafeRelativeName, RejectsTraversalAndOddNames) {
  using namespace std::string_view_literals;
  for (std::string_view n : {""sv, ".."sv, "../x"sv, "/etc/passwd"sv, "a/../../b"sv, "a/.."sv, "a\\b"sv,
                             "..\\x"sv, "a//b"sv, "a/"sv, "/"sv, "."sv, "./a"sv, "a/./b"sv, "a\0b"sv})
    EXPECT_FALSE(is_safe_relative_name(n)) << n;
}

// ---- Rejections: size, depth, JSON ----------------------------------------------

TEST(IndexReject, LargerThanLimit) {
  IndexLimits small;
  small.max_bytes = 100;
  EXPECT_TRUE(Rejects(serialize_index(sample()), "larger than the limit of 100", small));
}

TEST(IndexReject, LargerThanDefaultLimitBeforeParsing) {
  // 257 MiB of spaces: valid JSON whitespace, refused by size alone.
  std::string huge((257ull << 20), ' ');
  huge[0] = '{';
  huge.back() = '}';
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(Rejects(huge, "larger than the limit"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(IndexReject, DeepArrayNesting) {
  std::string text(100'000, '[');
  text += std::string(100'000, ']');
  EXPECT_TRUE(Rejects(text, "nesting deeper than 64 at byte 64"));
}

TEST(IndexReject, DeepObjectNestingInsideMetadata) {
  std::string deep;
  for (int i = 0; i < 100'000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(100'000, '}');
  std::string text = serialize_index(sample());
  text.replace(text.find("{\"data_pos\":123}"), 16, deep);
  EXPECT_TRUE(Rejects(text, "nesting deeper than 64"));
}

TEST(IndexReject, DepthLimitIsExact) {
  IndexLimits limits;
  limits.max_depth = 8;  // the deepest index part: root.prefixes.X[].{}.shards[].{}.box.start[]
  EXPECT_TRUE(parse_index(serialize_index(sample()), limits).ok());
  limits.max_depth = 7;
  EXPECT_TRUE(Rejects(serialize_index(sample()), "nesting deeper than 7", limits));
}

TEST(IndexReject, BracketsInsideStringsDoNotCount) {
  Index x = sample();
  x.metadata_json = OJson({{"s", std::string(1000, '[') + "\\\"[{"}}).dump();
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexReject, InvalidJson) {
  const std::string text = serialize_index(sample());
  EXPECT_TRUE(Rejects(text.substr(0, text.size() / 2), "invalid JSON"));
  EXPECT_TRUE(Rejects("", "invalid JSON"));
  EXPECT_TRUE(Rejects(text + "x", "invalid JSON"));
}

TEST(IndexReject, InvalidUtf8InString) {
  std::string text = serialize_index(sample());
  const std::string path = "\"params.bias\"";
  text.replace(text.find(path), path.size(), "\"params.\xff\xfe\"");
  EXPECT_TRUE(Rejects(text, "prefixes.model[1].path: invalid JSON"));
}

TEST(IndexReject, OverlongUtf8) {
  std::string text = serialize_index(sample());
  text.replace(text.find("params.bias"), 6, "\xc0\xaf\x2e");
  EXPECT_TRUE(Rejects(text, "prefixes.model[1].path: invalid JSON"));
}

TEST(IndexReject, LoneSurrogateEscape) {
  std::string text = serialize_index(sample());
  text.replace(text.find("params.bias"), 6, "\\ud800");
  EXPECT_TRUE(Rejects(text, "prefixes.model[1].path: invalid JSON"));
}

TEST(IndexReject, DuplicateTopLevelKey) {
  std::string text = serialize_index(sample());
  text.replace(text.find("\"step\""), 0, "\"step\": 5,\n  ");
  EXPECT_TRUE(Rejects(text, "step: duplicate key"));
}

TEST(IndexReject, DuplicateNestedKey) {
  std::string text = serialize_index(sample());
  const std::string from = "\"offset\": 0,";
  text.replace(text.find(from), from.size(), "\"offset\": 0, \"offset\": 0,");
  EXPECT_TRUE(Rejects(text, "prefixes.model[0].shards[0].offset: duplicate key"));
}

TEST(IndexReject, DuplicateKeyInLargeObject) {
  // Objects with many keys take the hash-set path.
  Index x = sample();
  OJson m;
  for (int i = 0; i < 100; ++i) m["k" + std::to_string(i)] = i;
  x.metadata_json = m.dump();
  std::string text = serialize_index(x);
  text.replace(text.find("\"k99\""), 5, "\"k42\"");
  EXPECT_TRUE(Rejects(text, "metadata.k42: duplicate key"));
}

TEST(IndexReject, RootNotAnObject) {
  EXPECT_TRUE(Rejects("[]", "index: expected an object, got an array"));
  EXPECT_TRUE(Rejects("42", "index: expected an object"));
}

// ---- Rejections: header --------------------------------------------------------

TEST(IndexReject, UnknownFormat) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["format"] = "tensorstore"; }),
                      "format: \"tensorstore\" is not \"ckptio\""));
}

TEST(IndexReject, MissingFormat) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j.erase("format"); }), "format: missing"));
}

TEST(IndexReject, UnknownVersion) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["version"] = 2; }), "version: unsupported version 2"));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["version"] = 0; }), "version: unsupported version 0"));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["version"] = "1"; }), "version: unsupported"));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["version"] = 1.0; }), "version: unsupported"));
}

TEST(IndexReject, MissingFields) {
  struct Case {
    std::function<void(OJson&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](OJson& j) { j.erase("version"); }, "version: missing"},
      {[](OJson& j) { j.erase("step"); }, "step: missing"},
      {[](OJson& j) { j.erase("created_unix_ns"); }, "created_unix_ns: missing"},
      {[](OJson& j) { j.erase("committed_unix_ns"); }, "committed_unix_ns: missing"},
      {[](OJson& j) { j.erase("metadata"); }, "metadata: missing"},
      {[](OJson& j) { j.erase("files"); }, "files: missing"},
      {[](OJson& j) { j.erase("prefixes"); }, "prefixes: missing"},
      {[](OJson& j) { j["files"][0].erase("name"); }, "files[0].name: missing"},
      {[](OJson& j) { j["files"][0].erase("size"); }, "files[0].size: missing"},
      {[](OJson& j) { j["prefixes"]["model"][1].erase("path"); }, "prefixes.model[1].path: missing"},
      {[](OJson& j) { j["prefixes"]["model"][1].erase("dtype"); }, "prefixes.model[1].dtype: missing"},
      {[](OJson& j) { j["prefixes"]["model"][1].erase("shape"); }, "prefixes.model[1].shape: missing"},
      {[](OJson& j) { j["prefixes"]["model"][1].erase("shards"); }, "prefixes.model[1].shards: missing"},
      {[](OJson& j) { shard0(j).erase("box"); }, "prefixes.model[0].shards[0].box: missing"},
      {[](OJson& j) { shard0(j)["box"].erase("start"); }, "prefixes.model[0].shards[0].box.start: missing"},
      {[](OJson& j) { shard0(j)["box"].erase("stop"); }, "prefixes.model[0].shards[0].box.stop: missing"},
      {[](OJson& j) { shard0(j).erase("file"); }, "prefixes.model[0].shards[0].file: missing"},
      {[](OJson& j) { shard0(j).erase("offset"); }, "prefixes.model[0].shards[0].offset: missing"},
      {[](OJson& j) { shard0(j).erase("length"); }, "prefixes.model[0].shards[0].length: missing"},
      {[](OJson& j) { shard0(j).erase("crc32c"); }, "prefixes.model[0].shards[0].crc32c: missing"},
  };
  for (const Case& c : cases) EXPECT_TRUE(Rejects(edited(c.edit), c.needle)) << c.needle;
}

TEST(IndexReject, WronglyTypedFields) {
  struct Case {
    std::function<void(OJson&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](OJson& j) { j["step"] = "12"; }, "step: expected a non-negative integer, got a string"},
      {[](OJson& j) { j["metadata"] = "{}"; }, "metadata: expected an object, got a string"},
      {[](OJson& j) { j["metadata"] = OJson::array(); }, "metadata: expected an object, got an array"},
      {[](OJson& j) { j["created_at"] = 5; }, "created_at: expected a string"},
      {[](OJson& j) { j["files"] = OJson::object(); }, "files: expected an array, got an object"},
      {[](OJson& j) { j["files"][0] = "x"; }, "files[0]: expected an object, got a string"},
      {[](OJson& j) { j["files"][0]["name"] = 3; }, "files[0].name: expected a string"},
      {[](OJson& j) { j["prefixes"] = OJson::array(); }, "prefixes: expected an object, got an array"},
      {[](OJson& j) { j["prefixes"]["model"] = OJson::object(); }, "prefixes.model: expected an array"},
      {[](OJson& j) { j["prefixes"]["model"][1] = nullptr; }, "prefixes.model[1]: expected an object, got null"},
      {[](OJson& j) { j["prefixes"]["model"][1]["path"] = true; }, "prefixes.model[1].path: expected a string, got true"},
      {[](OJson& j) { j["prefixes"]["model"][1]["dtype"] = 4; }, "prefixes.model[1].dtype: expected a string"},
      {[](OJson& j) { j["prefixes"]["model"][1]["shards"] = 1; }, "prefixes.model[1].shards: expected an array"},
      {[](OJson& j) { shard0(j) = OJson::array(); }, "prefixes.model[0].shards[0]: expected an object"},
      {[](OJson& j) { shard0(j)["box"] = OJson::array(); }, "prefixes.model[0].shards[0].box: expected an object"},
      {[](OJson& j) { shard0(j)["box"]["start"] = 0; }, "prefixes.model[0].shards[0].box.start: expected an array"},
      {[](OJson& j) { shard0(j)["file"] = OJson::array(); }, "prefixes.model[0].shards[0].file: expected a string"},
  };
  for (const Case& c : cases) EXPECT_TRUE(Rejects(edited(c.edit), c.needle)) << c.needle;
}

TEST(IndexReject, NegativeStep) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["step"] = -1; }), "step: expected a non-negative integer, got -1"));
}

TEST(IndexReject, NegativeTimes) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["created_unix_ns"] = -5; }), "created_unix_ns: expected a non-negative"));
}

TEST(IndexReject, StepBeyondInt64) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["step"] = uint64_t{1} << 63; }),
                      "step: 9223372036854775808 is larger than 9223372036854775807"));
}

TEST(IndexReject, FloatWhereIntegerExpected) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["offset"] = 1.5; }),
                      "prefixes.model[0].shards[0].offset: expected a non-negative integer, got the non-integer 1.5"));
  std::string text = serialize_index(sample());
  text.replace(text.find("\"step\": 1200"), 12, "\"step\": 1e3");
  EXPECT_TRUE(Rejects(text, "step: expected a non-negative integer, got the non-integer 1000"));
  text = serialize_index(sample());
  text.replace(text.find("\"step\": 1200"), 12, "\"step\": 1200.0");
  EXPECT_TRUE(Rejects(text, "step: expected a non-negative integer"));
}

TEST(IndexReject, IntegerBeyondUint64BecomesFloat) {
  std::string text = serialize_index(sample());
  const size_t at = text.find("\"size\": ") + 8;
  text.replace(at, text.find('}', at) - at, "18446744073709551616");  // 2^64
  EXPECT_TRUE(Rejects(text, "files[0].size: expected a non-negative integer, got the non-integer"));
}

TEST(IndexReject, NumberOverflow) {
  std::string text = serialize_index(sample());
  text.replace(text.find("\"step\": 1200"), 12, "\"step\": 1e999");
  EXPECT_TRUE(Rejects(text, "step: invalid JSON"));
}

// ---- Rejections: leaves -----------------------------------------------------------

TEST(IndexReject, UnknownDType) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["dtype"] = "float128"; }),
                      "prefixes.model[1].dtype: unknown dtype \"float128\""));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["dtype"] = "BFLOAT16"; }),
                      "unknown dtype"));
}

TEST(IndexReject, ShapeNotAnArray) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["shape"] = 6; }),
                      "prefixes.model[1].shape: expected an array"));
}

TEST(IndexReject, NegativeShapeDim) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["shape"] = {-6}; }),
                      "prefixes.model[1].shape[0]: expected a non-negative integer, got -6"));
}

TEST(IndexReject, NonIntegerShapeDim) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["shape"] = {"6"}; }),
                      "prefixes.model[1].shape[0]: expected a non-negative integer, got a string"));
}

TEST(IndexReject, RankAboveLimit) {
  IndexLimits limits;
  limits.max_rank = 1;
  EXPECT_TRUE(Rejects(serialize_index(sample()), "prefixes.model[0].shape: rank larger than the limit of 1", limits));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["shape"] = OJson(std::vector<int>(33, 1)); }),
                      "prefixes.model[1].shape: rank larger than the limit of 32"));
}

TEST(IndexReject, ShapeBytesOverflow) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_TRUE(Rejects(edited([&](OJson& j) { j["prefixes"]["model"][1]["shape"] = {big, big}; }),
                      "prefixes.model[1].shape: [1099511627776, 1099511627776] of \"float32\" holds more than 2^64 bytes"));
  // Fits in elements, not in bytes once multiplied by the itemsize.
  EXPECT_TRUE(Rejects(edited([&](OJson& j) { j["prefixes"]["model"][1]["shape"] = {int64_t{1} << 62}; }),
                      "prefixes.model[1].shape: [4611686018427387904] of \"float32\" holds more than 2^64 bytes"));
}

TEST(IndexReject, EmptyLeafPath) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["path"] = ""; }),
                      "prefixes.model[1].path: empty leaf path"));
}

TEST(IndexReject, LeafPathWithNul) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["path"] = std::string("a\0b", 3); }),
                      "prefixes.model[1].path: leaf path contains NUL"));
}

TEST(IndexReject, DuplicateLeafPath) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"]["model"][1]["path"] = "params.layers.0.attn.q_proj.kernel"; }),
                      "prefixes.model[1].path: duplicate leaf path \"params.layers.0.attn.q_proj.kernel\" (also at [0])"));
}

TEST(IndexReject, SameLeafPathInTwoPrefixesIsFine) {
  auto r = parse_index(edited([](OJson& j) { j["prefixes"]["tx"][0]["path"] = "params.bias"; }));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

TEST(IndexReject, EmptyPrefixName) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["prefixes"][""] = OJson::array(); }), "prefixes: empty prefix name"));
}

TEST(IndexReject, UnsafePrefixName) {
  for (const char* name : {"../x", "/abs", "a//b", "a\\b", "."})
    EXPECT_TRUE(Rejects(edited([&](OJson& j) { j["prefixes"][name] = OJson::array(); }), "prefixes: unsafe prefix name"))
        << name;
}

TEST(IndexReject, TooManyLeaves) {
  IndexLimits limits;
  limits.max_leaves = 2;  // the sample has three
  EXPECT_TRUE(Rejects(serialize_index(sample()), "prefixes.tx: the index holds more than the limit of 2 leaves", limits));
  limits.max_leaves = 3;
  EXPECT_TRUE(parse_index(serialize_index(sample()), limits).ok());
}

TEST(IndexReject, TooManyShardsPerLeaf) {
  IndexLimits limits;
  limits.max_shards_per_leaf = 3;  // the first leaf has four
  EXPECT_TRUE(Rejects(serialize_index(sample()), "prefixes.model[0].shards: more than the limit of 3 shards", limits));
}

// ---- Rejections: boxes and cover ---------------------------------------------------

TEST(IndexReject, BoxWrongRank) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["box"]["start"] = {0}; }),
                      "prefixes.model[0].shards[0].box.start: rank 1 does not match the leaf's rank 2"));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["box"]["stop"] = {2, 3, 1}; }),
                      "prefixes.model[0].shards[0].box.stop: rank 3 does not match the leaf's rank 2"));
}

TEST(IndexReject, BoxStartAfterStop) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["box"]["start"] = {0, 4}; }),
                      "prefixes.model[0].shards[0].box.start[1]: 4 is greater than stop[1] = 3"));
}

TEST(IndexReject, BoxNegative) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["box"]["start"] = {-1, 0}; }),
                      "prefixes.model[0].shards[0].box.start[0]: expected a non-negative integer, got -1"));
}

TEST(IndexReject, BoxBeyondShape) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) {
                        auto& s = j["prefixes"]["model"][0]["shards"][3];
                        s["box"]["stop"] = {4, 7};
                      }),
                      "prefixes.model[0].shards[3].box.stop[1]: 7 is beyond the leaf's shape[1] = 6"));
}

// One leaf of `shape` cut into `boxes`, for the cover checks.
std::string leaf_with_boxes(const Shape& shape, std::vector<Box> boxes) {
  return serialize_index(Builder().leaf("model", "w", DType::kFloat32, shape, std::move(boxes)).build());
}

TEST(IndexCover, OverlappingShards) {
  EXPECT_TRUE(Rejects(leaf_with_boxes({4}, {Box{{0}, {3}}, Box{{2}, {4}}}),
                      "prefixes.model[0].shards[1]: shards overlap"));
}

TEST(IndexCover, DuplicateShard) {
  EXPECT_TRUE(Rejects(leaf_with_boxes({2, 2}, {Box::whole({2, 2}), Box::whole({2, 2})}),
                      "prefixes.model[0].shards[1]: shards overlap"));
}

TEST(IndexCover, Hole) {
  EXPECT_TRUE(Rejects(leaf_with_boxes({4, 4}, {Box{{0, 0}, {2, 4}}, Box{{2, 0}, {4, 3}}}),
                      "prefixes.model[0].shards: shards leave a hole: their boxes hold 14 of the leaf's 16 elements"));
}

TEST(IndexCover, NoShardsForANonEmptyLeaf) {
  Index x = Builder().leaf("model", "w", DType::kFloat32, {2}).build();
  x.prefixes[0].leaves[0].shards.clear();
  EXPECT_TRUE(Rejects(serialize_index(x), "prefixes.model[0].shards: shards leave a hole"));
}

TEST(IndexCover, TwoScalarShards) {
  EXPECT_TRUE(Rejects(leaf_with_boxes({}, {Box{}, Box{}}), "prefixes.model[0].shards[1]: shards overlap"));
}

// Overlap and hole together, with the right total volume: only the
// disjointness test can tell. One case per algorithm (pairwise, 1-d sort,
// 2-d sweep, grid).
TEST(IndexCover, OverlapPlusHolePairwise) {
  EXPECT_TRUE(Rejects(leaf_with_boxes({4}, {Box{{0}, {2}}, Box{{1}, {3}}}),
                      "prefixes.model[0].shards[1]: box overlaps that of shards[0]"));
}

TEST(IndexCover, OverlapPlusHoleOneSplitDim) {
  auto boxes = grid({40, 3}, {40, 1});
  boxes[39] = boxes[7];
  EXPECT_TRUE(Rejects(leaf_with_boxes({40, 3}, boxes), "box overlaps that of shards["));
}

TEST(IndexCover, OverlapPlusHoleTwoSplitDims) {
  auto boxes = grid({10, 10, 3}, {5, 5, 1});
  boxes[24] = Box{{3, 3, 0}, {5, 5, 3}};  // shifted onto its neighbours' corner
  boxes[18] = Box{{8, 8, 0}, {10, 10, 3}};
  EXPECT_TRUE(Rejects(leaf_with_boxes({10, 10, 3}, boxes), "box overlaps that of shards["));
}

TEST(IndexCover, OverlapPlusHoleGrid) {
  auto boxes = grid({6, 6, 6}, {3, 3, 3});
  boxes[26].start = {2, 2, 2};
  boxes[26].stop = {4, 4, 4};
  EXPECT_TRUE(Rejects(leaf_with_boxes({6, 6, 6}, boxes), "box overlaps that of shards["));
}

TEST(IndexCover, IrregularButExactCoversAreAccepted) {
  // A pinwheel (no straight cut separates it) in 2-d, and a brick wall.
  std::vector<Box> pinwheel = {Box{{0, 0}, {2, 1}}, Box{{2, 0}, {3, 2}}, Box{{1, 2}, {3, 3}},
                               Box{{0, 1}, {1, 3}}, Box{{1, 1}, {2, 2}}};
  EXPECT_TRUE(parse_index(leaf_with_boxes({3, 3}, pinwheel)).ok());
  std::vector<Box> wall;
  for (int64_t row = 0; row < 30; ++row) {
    const int64_t shift = row % 3;
    wall.push_back(Box{{row, 0, 0}, {row + 1, shift + 1, 2}});
    wall.push_back(Box{{row, shift + 1, 0}, {row + 1, 10, 1}});
    wall.push_back(Box{{row, shift + 1, 1}, {row + 1, 10, 2}});
  }
  auto r = parse_index(leaf_with_boxes({30, 10, 2}, wall));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

TEST(IndexCover, TooIrregularToVerify) {
  // 600 slabs each cut at its own places along two more dimensions: an exact
  // cover whose compressed grid has ~4e8 cells, beyond the documented 2^27.
  const int64_t n = 600;
  std::vector<Box> boxes;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t y = i + 1, z1 = 2 * i + 1, z2 = 2 * i + 2;
    boxes.push_back(Box{{i, 0, 0}, {i + 1, y, 2 * n}});
    boxes.push_back(Box{{i, y, 0}, {i + 1, n + 1, z1}});
    boxes.push_back(Box{{i, y, z1}, {i + 1, n + 1, z2}});
    boxes.push_back(Box{{i, y, z2}, {i + 1, n + 1, 2 * n}});
  }
  EXPECT_TRUE(Rejects(leaf_with_boxes({n, n + 1, 2 * n}, boxes), "shard layout too irregular to verify"));
}

TEST(IndexCover, LargeGridsAreFast) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(parse_index(leaf_with_boxes({300, 300}, grid({300, 300}, {150, 150}))).ok());  // 2-d sweep
  EXPECT_TRUE(parse_index(leaf_with_boxes({40, 40, 40}, grid({40, 40, 40}, {20, 20, 20}))).ok());  // grid
  EXPECT_TRUE(parse_index(leaf_with_boxes({30000}, grid({30000}, {30000}))).ok());  // 1-d
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  22500 + 8000 + 30000 shards parsed in %.3f s\n", s);
  EXPECT_LT(s, 30.0);
}

// ---- Rejections: shards and files -------------------------------------------------

TEST(IndexReject, LengthNotBoxBytes) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["length"] = 11; }),
                      "prefixes.model[0].shards[0].length: 11, but the box holds 12 bytes"));
}

TEST(IndexReject, OffsetPlusLengthOverflows) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) {
                        shard0(j)["offset"] = UINT64_MAX - 5;
                        j["files"][0]["size"] = UINT64_MAX;
                      }),
                      "prefixes.model[0].shards[0].offset: offset + length overflows 64 bits"));
}

TEST(IndexReject, ShardPastEndOfFile) {
  const Index x = sample();
  const uint64_t size = x.files[0].size;
  EXPECT_TRUE(Rejects(edited([&](OJson& j) { j["files"][0]["size"] = size - 1; }),
                      "prefixes.tx[0].shards[0].offset: bytes [" + std::to_string(size - 8) + ", " +
                          std::to_string(size) + ") lie beyond the end of \"" + kFile + "\" (size " +
                          std::to_string(size - 1) + ")"));
}

// The empty shard's checksum is 0 (format.md §2.4): verify reported
// anything else as a mismatch while both readers took it.
TEST(IndexReject, EmptyShardWithANonZeroChecksum) {
  Index x = Builder().leaf("model", "w", DType::kFloat32, {4, 4}, {Box::whole({4, 4}), Box{{2, 1}, {2, 4}}}).build();
  ASSERT_EQ(x.prefixes[0].leaves[0].shards[1].length, 0u);
  x.prefixes[0].leaves[0].shards[1].crc32c = 7;
  EXPECT_TRUE(Rejects(serialize_index(x), "prefixes.model[0].shards[1].crc32c: an empty shard's checksum is 0, not 7"));
}

TEST(IndexReject, ShardFileNotListed) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["file"] = "data-other-0.bin"; }),
                      "prefixes.model[0].shards[0].file: \"data-other-0.bin\" is not listed in \"files\""));
}

TEST(IndexReject, DuplicateFileName) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["files"].push_back(j["files"][0]); }),
                      std::string("files[1].name: duplicate data file name \"") + kFile + "\" (also files[0])"));
}

TEST(IndexReject, NegativeFileSize) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { j["files"][0]["size"] = -1; }),
                      "files[0].size: expected a non-negative integer, got -1"));
}

TEST(IndexReject, TraversalFileNames) {
  using namespace std::string_literals;
  for (const std::string& name : {"../x"s, "/etc/passwd"s, "a/../../b"s, "a\\b"s, "x\0y"s, ""s, "."s, ".."s,
                                  "a//b"s, "sub/data.bin"s})
    EXPECT_TRUE(Rejects(edited([&](OJson& j) {
                          j["files"][0]["name"] = name;
                          for (auto& [p, leaves] : j["prefixes"].items())
                            for (auto& l : leaves)
                              for (auto& s : l["shards"]) s["file"] = name;
                        }),
                        "files[0].name: unsafe data file name"))
        << name;
}

TEST(IndexReject, CrcOutOfRange) {
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["crc32c"] = uint64_t{1} << 32; }),
                      "prefixes.model[0].shards[0].crc32c: 4294967296 is larger than 4294967295"));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["crc32c"] = -1; }),
                      "prefixes.model[0].shards[0].crc32c: expected a non-negative integer, got -1"));
  EXPECT_TRUE(Rejects(edited([](OJson& j) { shard0(j)["crc32c"] = 3.0; }),
                      "prefixes.model[0].shards[0].crc32c: expected a non-negative integer"));
}

TEST(IndexReject, TotalBytesOverflow) {
  // Three leaves of 2^63 - 1 bytes each, each in its own file.
  const int64_t n = INT64_MAX;
  Builder b;
  for (int i = 0; i < 3; ++i)
    b.leaf("model", "w" + std::to_string(i), DType::kUInt8, {n}, {}, "data-" + std::to_string(i) + ".bin");
  EXPECT_TRUE(RoundTrips(Builder().leaf("model", "w0", DType::kUInt8, {n}).leaf("model", "w1", DType::kUInt8, {n}, {}, "d1").build()));
  EXPECT_TRUE(Rejects(serialize_index(b.build()),
                      "prefixes.model[2].shards[0].length: the index's total of shard lengths overflows 64 bits"));
}

// ---- Serialize never hides a bad input ------------------------------------------

TEST(IndexSerialize, InvalidMetadataIsWrittenSoThatReadersRefuseIt) {
  for (const char* bad : {"", "not json", "[1,2]", "{\"a\":1,\"a\":2}"}) {
    Index x = sample();
    x.metadata_json = bad;
    EXPECT_TRUE(Rejects(serialize_index(x), "metadata: expected an object, got a string")) << bad;
  }
  Index x = sample();
  x.metadata_json = "{\"a\":\"\xff\"}";  // raw in the string: the lexer refuses it
  EXPECT_TRUE(Rejects(serialize_index(x), "metadata: invalid JSON"));
}

TEST(IndexSerialize, InvalidUtf8NamesAreWrittenSoThatReadersRefuseThem) {
  Index x = sample();
  x.prefixes[0].leaves[1].path = "params.\xff";
  EXPECT_TRUE(Rejects(serialize_index(x), "prefixes.model[1].path: invalid JSON"));
}

TEST(IndexSerialize, ControlCharactersAreEscaped) {
  Index x = sample();
  x.prefixes[0].leaves[1].path = "tab\there\nquote\"back\\slash\x01";
  EXPECT_TRUE(RoundTrips(x));
}

TEST(IndexSerialize, CheckMetadataJson) {
  EXPECT_TRUE(check_metadata_json("{}").ok());
  EXPECT_TRUE(check_metadata_json(R"({"a":[1,{"b":null}]})").ok());
  for (const char* bad : {"", "[]", "1", "{", "{\"a\":1,\"a\":1}"}) {
    Status st = check_metadata_json(bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("metadata"), std::string::npos) << st.message();
  }
  std::string deep;
  for (int i = 0; i < 63; ++i) deep += "{\"a\":";
  deep += "1" + std::string(63, '}');
  EXPECT_TRUE(check_metadata_json(deep).ok());  // 63 + the index object = 64
  Index x = sample();
  x.metadata_json = deep;
  EXPECT_TRUE(RoundTrips(x));
  EXPECT_FALSE(check_metadata_json("{\"b\":" + deep + "}").ok());
}

// ---- Performance ------------------------------------------------------------------------

// Sanitizer builds run several times slower; the limits scale with them.
#if defined(__SANITIZE_ADDRESS__)
constexpr double kSlowdown = 3;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr double kSlowdown = 3;
#else
constexpr double kSlowdown = 1;
#endif
#else
constexpr double kSlowdown = 1;
#endif

TEST(IndexPerformance, HundredThousandLeaves) {
  Builder b;
  for (int i = 0; i < 100'000; ++i)
    b.leaf(i % 2 ? "model" : "tx", "params.layers." + std::to_string(i) + ".kernel", DType::kBFloat16, {64, 32});
  const Index x = b.build();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string text = serialize_index(x);
  const auto t1 = std::chrono::steady_clock::now();
  auto r = parse_index(text);
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(*r == x);
  const double ser = std::chrono::duration<double>(t1 - t0).count();
  const double parse = std::chrono::duration<double>(t2 - t1).count();
  std::printf("  100000 leaves, %.1f MB: serialize %.3f s, parse %.3f s\n", text.size() / 1e6, ser, parse);
  EXPECT_LT(parse, 10.0 * kSlowdown);
}

// ---- Large shard counts: 10,000 shards on one leaf -----------------------------------
// A 100 x 100 grid on a [1000, 1000] leaf takes the 2-d sweep; each defect is
// caught with the shard named.

std::vector<Box> grid_100x100() { return grid({1000, 1000}, {100, 100}); }

TEST(IndexLargeCover, TenThousandShardGridIsAcceptedFast) {
  const std::string text = leaf_with_boxes({1000, 1000}, grid_100x100());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = parse_index(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prefixes[0].leaves[0].shards.size(), 10'000u);
  std::printf("  10000 shards (%.1f MB) parsed in %.3f s\n", text.size() / 1e6, s);
  EXPECT_LT(s, 5.0);
}

TEST(IndexLargeCover, TenThousandShardGridWithOneOverlappingPair) {
  // Shard 5050 moved 5 columns right: same total volume, so only the
  // disjointness test can see it (it overlaps shard 5051 and leaves a hole).
  auto boxes = grid_100x100();
  boxes[5050].start[1] += 5;
  boxes[5050].stop[1] += 5;
  EXPECT_TRUE(Rejects(leaf_with_boxes({1000, 1000}, boxes), "box overlaps that of shards["));
  // One extra box on top of a complete grid: too much volume.
  boxes = grid_100x100();
  boxes.push_back(Box{{505, 505}, {515, 515}});
  EXPECT_TRUE(Rejects(leaf_with_boxes({1000, 1000}, boxes), "prefixes.model[0].shards[10000]: shards overlap"));
}

TEST(IndexLargeCover, TenThousandShardGridWithOneMissing) {
  auto boxes = grid_100x100();
  boxes.erase(boxes.begin() + 4321);
  EXPECT_TRUE(Rejects(leaf_with_boxes({1000, 1000}, boxes),
                      "prefixes.model[0].shards: shards leave a hole: their boxes hold 999900 of the leaf's "
                      "1000000 elements"));
}

TEST(IndexLargeCover, ThreeHundredMiBAgainstTheDefaultLimit) {
  const std::string huge(300u << 20, ' ');
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(Rejects(huge, "index: 314572800 bytes, larger than the limit of 268435456"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));  // by size alone
}

// ---- 100 MB of JSON within the default limit ------------------------------------------
// parse_index streams (SAX) and never builds a document tree, so its memory
// is what it keeps: the Index, the canonical metadata text, the keys of the
// object being read (duplicate detection) and nlohmann's token buffer for
// the string being lexed. Each is proportional to the bytes given, which are
// capped by IndexLimits::max_bytes. These tests measure the peak resident
// memory a parse adds, in a forked child (VmHWM after resetting it through
// /proc/self/clear_refs), for 100 MB documents of the shapes an attacker
// would pick, and hold it to the bound docs/format.md §3.1 states.

// 24 MB under a sanitizer, where the bound is not checked (below) and what
// is left to find (memory errors, races) needs no more than that: still
// more than max_object_members short keys, so every case keeps its verdict.
constexpr size_t kHugeBytes = kUnderSanitizer ? 24'000'000 : 100'000'000;
constexpr double kMaxGrowthPerInputByte = 4.0;  // docs/format.md §3.1

uint64_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key)));
  return 0;
}

struct ParseFootprint {
  bool ok = false;
  std::string error;
  double peak_growth = 0;  // bytes of resident memory the parse added at its peak
  double seconds = 0;
};

// Parses `text` in a forked child and reports the peak memory it added.
ParseFootprint parse_footprint(const std::string& text) {
  int fds[2];
  if (pipe(fds) != 0) return {false, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
    const uint64_t before = proc_status_kb("VmRSS:");
    const auto t0 = std::chrono::steady_clock::now();
    auto r = parse_index(text);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t peak = proc_status_kb("VmHWM:");
    std::string msg = std::to_string((peak - std::min(peak, before)) * 1024) + " " + std::to_string(secs) + " " +
                      (r.ok() ? "ok" : r.status().message().substr(0, 300));
    if (write(fds[1], msg.data(), msg.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ParseFootprint f;
  const size_t a = got.find(' '), b = got.find(' ', a + 1);
  if (a == std::string::npos || b == std::string::npos) return {false, "child failed: " + got};
  f.peak_growth = std::stod(got.substr(0, a));
  f.seconds = std::stod(got.substr(a + 1, b - a - 1));
  f.error = got.substr(b + 1);
  f.ok = f.error == "ok";
  return f;
}

// The sample index with `member` spliced in as the first member of the
// metadata object or (top_level) of the document.
std::string with_member(const std::string& member, bool top_level) {
  std::string text = serialize_index(sample());
  const size_t at = top_level ? text.find('{') + 1 : text.find("{\"data_pos\":123}") + 1;
  return text.insert(at, member + ",");
}

void expect_bounded(const std::string& what, const std::string& text, bool accepted) {
  ASSERT_GE(text.size(), kHugeBytes) << what;
  ASSERT_LE(text.size(), IndexLimits{}.max_bytes) << what;
  const ParseFootprint f = parse_footprint(text);
  std::printf("  %-44s %6.1f MB: %s in %.2f s, peak +%.0f MB (%.2f x the input)\n", what.c_str(),
              text.size() / 1e6, f.ok ? "accepted" : "refused", f.seconds, f.peak_growth / 1e6,
              f.peak_growth / text.size());
  EXPECT_EQ(f.ok, accepted) << what << ": " << f.error;
#ifdef CKPTIO_UNDER_SANITIZER
  std::printf("  (not checked against the bound: a sanitizer's shadow memory and quarantine count too)\n");
#else
  EXPECT_GT(f.peak_growth, 0) << what << ": the measurement did not work";
  EXPECT_LE(f.peak_growth, kMaxGrowthPerInputByte * static_cast<double>(text.size())) << what;
#endif
}

TEST(IndexHugeInput, OneHundredMegabyteStringsAreBoundedByTheirSize) {
  const std::string big(kHugeBytes, 'x');
  expect_bounded("one string in metadata", with_member("\"s\":\"" + big + "\"", false), true);
  expect_bounded("one string in an unknown field", with_member("\"future\":\"" + big + "\"", true), true);
  std::string escaped;  // \u escapes: 6 input bytes per character kept
  escaped.reserve(kHugeBytes + 8);
  while (escaped.size() < kHugeBytes) escaped += "\\u00e9";
  expect_bounded("escaped string in metadata", with_member("\"s\":\"" + escaped + "\"", false), true);
  // A string where a number belongs: refused at the value, before anything is kept.
  std::string text = serialize_index(sample());
  const size_t step = text.find("\"step\": ");
  ASSERT_NE(step, std::string::npos);
  text.insert(step + 8, "\"" + big + "\", \"ignored\": ");
  expect_bounded("string for the step number", text, false);
}

TEST(IndexHugeInput, OneHundredMegabyteArraysAndObjectsAreBoundedByTheirSize) {
  auto repeat = [](const std::string& open, const std::string& item, const std::string& close) {
    std::string s = open;
    s.reserve(kHugeBytes + 64);
    for (size_t i = 0; s.size() < kHugeBytes; ++i) s += (i ? "," : "") + item;
    return s + close;
  };
  expect_bounded("zeros in a metadata array", with_member("\"a\":" + repeat("[", "0", "]"), false), true);
  expect_bounded("empty arrays in an unknown field", with_member("\"f\":" + repeat("[", "[]", "]"), true), true);
  // Short keys are the costliest input (each kept to refuse duplicates):
  // more than max_object_members of them are refused as they arrive.
  std::string keys = "{";
  keys.reserve(kHugeBytes + 64);
  for (size_t i = 0; keys.size() < kHugeBytes; ++i) keys += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  keys += "}";
  expect_bounded("short distinct keys in a metadata object", with_member("\"o\":" + keys, false), false);
  expect_bounded("short distinct keys in an unknown object", with_member("\"o\":" + keys, true), false);
  EXPECT_TRUE(Rejects(with_member("\"o\":" + keys, false), "metadata.o.1000000: more than 1000000 members in one object"));
  // The limit itself is accepted: 1M keys of ~100 bytes (~28 under a sanitizer).
  keys = "{";
  for (size_t i = 0; i < IndexLimits{}.max_object_members; ++i)
    keys += (i ? ",\"" : "\"") + std::string(kUnderSanitizer ? 20 : 92, 'k') + std::to_string(i) + "\":0";
  keys += "}";
  expect_bounded("1M long keys in a metadata object", with_member("\"o\":" + keys, false), true);
  // Many leaves: a real index of 1 M one-byte leaves, and the same with one
  // shard past the end of its file, refused only when the document closes.
  std::string leaves = "{\"format\": \"ckptio\", \"version\": 1, \"step\": 1, \"created_unix_ns\": 1, "
                       "\"committed_unix_ns\": 1, \"metadata\": {}, \"prefixes\": {\"model\": [";
  leaves.reserve(kHugeBytes + 1024);
  uint64_t n = 0;
  for (; leaves.size() < kHugeBytes; ++n)
    leaves += std::string(n ? "," : "") + "{\"path\":\"p" + std::to_string(n) +
              "\",\"dtype\":\"int8\",\"shape\":[],\"shards\":[{\"box\":{\"start\":[],\"stop\":[]},"
              "\"file\":\"d.bin\",\"offset\":" + std::to_string(n) + ",\"length\":1,\"crc32c\":0}]}";
  leaves += "]}, \"files\": [{\"name\": \"d.bin\", \"size\": ";
  expect_bounded(std::to_string(n / 1000) + "k leaves of one shard each", leaves + std::to_string(n) + "}]}", true);
  expect_bounded("the same, last shard past its file", leaves + std::to_string(n - 1) + "}]}", false);
}

// ---- The cover verdict against brute force ---------------------------------------------
// Random partitions (not only grids: boxes grown greedily, so most layouts
// are not guillotine cuts) of ranks 1-4, some perturbed so that the volumes
// still add up but boxes overlap, with empty boxes sprinkled in and shards
// shuffled. parse_index must accept exactly the exact covers, whichever of
// its four algorithms (pairwise, sort, sweep, grid) the layout selects.

bool brute_force_exact_cover(const Shape& shape, const std::vector<Box>& boxes) {
  std::vector<int> hits(*checked_num_bytes(shape), 0);
  for (const Box& b : boxes) {
    if (volume(b) == 0) continue;
    std::vector<int64_t> idx = b.start;
    for (;;) {
      uint64_t flat = 0;
      for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
      if (hits[flat]++) return false;
      size_t d = shape.size();
      while (d > 0 && ++idx[d - 1] == b.stop[d - 1]) {
        idx[d - 1] = b.start[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  return std::find(hits.begin(), hits.end(), 0) == hits.end();
}

TEST(IndexCover, RandomLayoutsAgreeWithBruteForce) {
  std::mt19937_64 rng(20261123);
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int accepted = 0, rejected = 0, many = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t rank = rnd(1, 4);
    Shape shape(rank);
    for (auto& d : shape) d = rnd(1, rank <= 2 ? 12 : 6);
    // Grow boxes from each still-uncovered cell, in C order.
    const uint64_t n = *checked_num_bytes(shape);
    std::vector<char> used(n, 0);
    auto flat = [&](const std::vector<int64_t>& i) {
      uint64_t f = 0;
      for (size_t d = 0; d < rank; ++d) f = f * shape[d] + i[d];
      return f;
    };
    auto free_box = [&](const Box& b) {
      std::vector<int64_t> idx = b.start;
      for (;;) {
        if (used[flat(idx)]) return false;
        size_t d = rank;
        while (d > 0 && ++idx[d - 1] == b.stop[d - 1]) {
          idx[d - 1] = b.start[d - 1];
          --d;
        }
        if (d == 0) return true;
      }
    };
    const int64_t reach = rnd(0, 4);
    std::vector<Box> boxes;
    for (uint64_t c = 0; c < n; ++c) {
      if (used[c]) continue;
      Box b;
      uint64_t t = c;
      b.start.resize(rank);
      for (size_t d = rank; d-- > 0;) b.start[d] = t % shape[d], t /= shape[d];
      b.stop = b.start;
      for (auto& s : b.stop) ++s;
      for (int round = 0; round < 3; ++round)
        for (size_t d = 0; d < rank; ++d)
          for (int64_t k = rnd(0, reach); k > 0 && b.stop[d] < shape[d]; --k) {
            Box slab = b;
            slab.start[d] = b.stop[d];
            slab.stop[d] = b.stop[d] + 1;
            if (!free_box(slab)) break;
            ++b.stop[d];
          }
      std::vector<int64_t> idx = b.start;
      for (;;) {
        used[flat(idx)] = 1;
        size_t d = rank;
        while (d > 0 && ++idx[d - 1] == b.stop[d - 1]) {
          idx[d - 1] = b.start[d - 1];
          --d;
        }
        if (d == 0) break;
      }
      boxes.push_back(b);
    }
    switch (rnd(0, 4)) {
      case 1: {  // shift one box by one cell: overlap + hole, same volume
        Box& b = boxes[rnd(0, boxes.size() - 1)];
        const size_t d = rnd(0, rank - 1);
        if (b.stop[d] < shape[d]) ++b.start[d], ++b.stop[d];
        else if (b.start[d] > 0) --b.start[d], --b.stop[d];
        break;
      }
      case 2: {  // one box replaced by a copy of another of the same volume
        const size_t i = rnd(0, boxes.size() - 1), j = rnd(0, boxes.size() - 1);
        if (volume(boxes[i]) == volume(boxes[j])) boxes[i] = boxes[j];
        break;
      }
      case 3: {  // transpose two extents of one box
        Box& b = boxes[rnd(0, boxes.size() - 1)];
        const size_t d = rnd(0, rank - 1), e = rnd(0, rank - 1);
        const int64_t xd = b.stop[d] - b.start[d], xe = b.stop[e] - b.start[e];
        if (d != e && b.start[d] + xe <= shape[d] && b.start[e] + xd <= shape[e])
          b.stop[d] = b.start[d] + xe, b.stop[e] = b.start[e] + xd;
        break;
      }
      case 4:  // empty boxes anywhere inside the shape
        for (int k = 0; k < 5; ++k) {
          Box b = boxes[rnd(0, boxes.size() - 1)];
          const size_t d = rnd(0, rank - 1);
          b.stop[d] = b.start[d];
          boxes.push_back(b);
        }
        break;
      default: break;
    }
    std::shuffle(boxes.begin(), boxes.end(), rng);
    const bool truth = brute_force_exact_cover(shape, boxes);
    auto r = parse_index(leaf_with_boxes(shape, boxes));
    ASSERT_EQ(r.ok(), truth) << "iteration " << iter << ": " << (r.ok() ? "accepted" : r.status().message())
                             << "\n" << leaf_with_boxes(shape, boxes);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kDataLoss);
      EXPECT_NE(r.status().message().find("prefixes.model[0].shards"), std::string::npos)
          << r.status().message();
    }
    (truth ? accepted : rejected)++;
    many += boxes.size() > 16;
  }
  // The generator must exercise both verdicts and the non-pairwise paths.
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 200);
  EXPECT_GT(many, 300);
}

// ---- printable(): outside text in messages and on terminals ----------------

TEST(Printable, EscapesControlsAndC1ControlsAndKeepsUtf8Whole) {
  EXPECT_EQ(printable("a\x1b[2Jb\x7f"), "a\\x1B[2Jb\\x7F");
  EXPECT_EQ(printable("caf\xc3\xa9 \xc2\x9b" "31m"), "caf\xc3\xa9 \\xC2\\x9B31m");  // U+009B: CSI
  EXPECT_EQ(printable("a\nb\tc"), "a\\x0Ab\\x09c");
  EXPECT_EQ(printable("a\nb\tc\r", Printable{SIZE_MAX, false, /*keep_lines=*/true}), "a\nb\tc\\x0D");
  EXPECT_EQ(ascii_printable("caf\xc3\xa9"), "caf\\xC3\\xA9");
  // The cut: at most max bytes of output, never inside a UTF-8 sequence or an escape.
  EXPECT_EQ(printable("abcdef", 4), "abcd...");
  EXPECT_EQ(printable("ab\xc3\xa9z", 3), "ab...");
  EXPECT_EQ(printable("ab\x01z", 5), "ab...");
  EXPECT_EQ(printable("ab\x01z", 6), "ab\\x01...");
  EXPECT_EQ(printable("abc", 3), "abc");
  const std::string big(1 << 20, '\x01');
  EXPECT_EQ(printable(big, 256).size(), 256 / 4 * 4 + 3);
}

}  // namespace
}  // namespace ckptio
