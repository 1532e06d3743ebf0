// Fuzzes the partition rules and spec readers (src/sharding/json.cc,
// src/sharding/rules.cc): a --rules file and specs are user input.
//
// Properties checked on every input (any violation aborts):
//   - PartitionRules::from_json and parse_partition_spec_json never crash,
//     hang, leak or trip a sanitizer; rejections are kInvalidArgument;
//   - accepted rules answer first_match and match_partition_rules on a few
//     eformer-like paths and shapes without failing other than with
//     kInvalidArgument, and a matched spec under strict rules is no longer
//     than the leaf's rank;
//   - an accepted spec round-trips through to_json.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ckptio/sharding.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "partition_rules_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = ckptio::parse_partition_spec_json(text);
  if (!spec.ok() && spec.status().code() != ckptio::Code::kInvalidArgument)
    fail("spec rejection is not kInvalidArgument", spec.status().to_string());
  if (spec.ok()) {
    auto back = ckptio::parse_partition_spec_json(spec->to_json());
    if (!back.ok() || !(*back == *spec)) fail("spec does not round-trip", spec->to_json());
  }
  auto rules = ckptio::PartitionRules::from_json(text);
  if (!rules.ok()) {
    if (rules.status().code() != ckptio::Code::kInvalidArgument)
      fail("rules rejection is not kInvalidArgument", rules.status().to_string());
    return 0;
  }
  const struct {
    const char* path;
    ckptio::Shape shape;
  } leaves[] = {{"params.layers.0.attn.q_proj.kernel", {64, 64}},
                {"params.embed.embedding", {1000, 64}},
                {"opt_state.count", {}},
                {"params/final_norm/scale", {64}},
                {"a", {0, 3, 1 << 20}}};
  for (const auto& l : leaves) {
    (void)rules->first_match(ckptio::rule_match_path(l.path));
    auto m = ckptio::match_partition_rules(*rules, l.path, l.shape);
    if (!m.ok()) {
      if (m.status().code() != ckptio::Code::kInvalidArgument)
        fail("match failure is not kInvalidArgument", m.status().to_string());
      continue;
    }
    if (m->spec.size() > l.shape.size()) fail("strict match longer than the rank", m->spec.to_string());
  }
  return 0;
}
