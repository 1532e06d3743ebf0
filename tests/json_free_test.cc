// src/util/json_free.h: parse_json_into reads what nlohmann's parser reads
// (values, member order, duplicates, errors), and free_json takes any
// document apart, however deep. (That neither allocates where nlohmann
// would is what the allocation sweeps of tests/alloc/ check.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/util/json_free.h"

namespace ckptio {
namespace {

const std::vector<std::string> kDocuments = {
    "{}",
    "[]",
    "null",
    "17",
    R"("a string \u00e9\ud83d\ude00")",
    R"({"z": 1, "a": [1, 2, {"y": null, "b": [[], {}]}], "m": {"k": "v", "c": [true, false, 1.5e3]}})",
    R"({"dup": 1, "x": 2, "dup": {"deep": [1]}})",  // a repeated key: the last value, the first place
    R"([{"a": 1}, {"a": 2, "b": [3, {"c": [4]}]}, [[[[5]]]]])",
    R"({"format": "tensorstore", "prefixes": {"tx": [{"path": "a", "shape": [2, 3]}], "model": []}})",
};

template <class J>
void expect_same_as_nlohmann() {
  for (const std::string& text : kDocuments) {
    SCOPED_TRACE(text);
    J got;
    JsonFreer free_got(got);
    parse_json_into(got, text);
    const J want = J::parse(text);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got.dump(), want.dump());  // ordered_json: the members in file order
  }
}

TEST(JsonFree, ParseIntoReadsWhatNlohmannReads) {
  expect_same_as_nlohmann<nlohmann::json>();
  expect_same_as_nlohmann<nlohmann::ordered_json>();
}

TEST(JsonFree, ParseIntoThrowsNlohmannsParseErrorAtTheSameByte) {
  for (const std::string text : {"{", "[1, 2", R"({"a": })", "nul", "", R"({"a": 1} x)"}) {
    SCOPED_TRACE(text);
    size_t want = 0;
    try {
      const nlohmann::ordered_json accepted = nlohmann::ordered_json::parse(text);
      FAIL() << "nlohmann accepted it: " << accepted.dump();
    } catch (const nlohmann::ordered_json::parse_error& e) {
      want = e.byte;
    }
    nlohmann::ordered_json got;
    JsonFreer free_got(got);
    try {
      parse_json_into(got, text);
      FAIL() << "parse_json_into accepted it";
    } catch (const nlohmann::ordered_json::parse_error& e) {
      EXPECT_EQ(e.byte, want);
    }
  }
}

// A number too large for a double is out_of_range (406) to nlohmann's
// parser; callers catch parse_error for text that is not JSON, as
// parse(text, nullptr, false) discarded it (the credentials fuzzer's find:
// `0{">>>A00Z":444444444e444ar` ended the process).
TEST(JsonFree, ParseIntoReportsAnOverflowingNumberAsAParseError) {
  for (const std::string text : {R"({"a": 1e999})", "[-1e400]", R"({">>>A00Z":444444444e444})"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_discarded());
    nlohmann::json got;
    JsonFreer free_got(got);
    EXPECT_THROW(parse_json_into(got, text), nlohmann::json::parse_error);
    nlohmann::ordered_json ordered;
    JsonFreer free_ordered(ordered);
    EXPECT_THROW(parse_json_into(ordered, text), nlohmann::ordered_json::parse_error);
  }
}

TEST(JsonFree, FreeJsonEmptiesEveryContainer) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(kDocuments[5]);
  free_json(j);
  EXPECT_TRUE(j.is_object());
  EXPECT_TRUE(j.empty());
  nlohmann::json a = nlohmann::json::parse(kDocuments[7]);
  free_json(a);
  EXPECT_TRUE(a.is_array());
  EXPECT_TRUE(a.empty());
}

// Deeper than the 64 ancestors it keeps at hand: walked again from the root,
// without recursion (a stack overflow would end the test).
TEST(JsonFree, FreeJsonTakesApartAnyDepth) {
  const int depth = 20000;
  std::string text;
  for (int i = 0; i < depth; ++i) text += i % 2 ? R"({"k": )" : "[1, ";
  text += "0";
  for (int i = depth - 1; i >= 0; --i) text += i % 2 ? "}" : "]";
  nlohmann::ordered_json j;
  {
    JsonFreer free_j(j);
    parse_json_into(j, text);
    ASSERT_TRUE(j.is_array());
    ASSERT_EQ(j.size(), 2u);
  }
  EXPECT_TRUE(j.is_array());
  EXPECT_TRUE(j.empty());
}

}  // namespace
}  // namespace ckptio
