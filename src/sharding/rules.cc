// Partition rules: eformer's match_partition_rules on RE2.
//
// RE2 rather than std::regex or PCRE: matching time is linear in the path
// whatever the pattern (a rules file is user input), it never throws, and its
// syntax is Python's for everything rules use in practice; what differs is
// screened by check_python_regex before compiling.
#include <re2/re2.h>

#include <algorithm>

#include "ckptio/sharding.h"
#include "src/sharding/regex.h"

namespace ckptio {

struct PartitionRules::Compiled {
  std::vector<PartitionRule> rules;
  std::vector<std::unique_ptr<const RE2>> programs;  // one per rule; RE2 matching is thread-safe
};

Result<PartitionRules> PartitionRules::compile(std::vector<PartitionRule> rules) {
  auto c = std::make_shared<Compiled>();
  c->programs.reserve(rules.size());
  for (size_t i = 0; i < rules.size(); ++i) {
    const std::string at = "rules[" + std::to_string(i) + "]";
    CKPTIO_ASSIGN_OR_RETURN(auto re, compile_python_regex(rules[i].regex, at));
    c->programs.push_back(std::move(re));
  }
  c->rules = std::move(rules);
  PartitionRules r;
  r.compiled_ = std::move(c);
  return r;
}

const std::vector<PartitionRule>& PartitionRules::rules() const {
  static const std::vector<PartitionRule> kNone;
  return compiled_ ? compiled_->rules : kNone;
}

std::optional<size_t> PartitionRules::first_match(std::string_view text) const {
  if (!compiled_) return std::nullopt;
  const re2::StringPiece piece(text.data(), text.size());
  for (size_t i = 0; i < compiled_->programs.size(); ++i)
    if (RE2::PartialMatch(piece, *compiled_->programs[i])) return i;  // re.search: anywhere
  return std::nullopt;
}

std::string rule_match_path(std::string_view leaf_path) {
  std::string s(leaf_path);
  for (char& c : s)
    if (c == '.') c = '/';
  return s;
}

Result<RuleMatch> match_partition_rules(const PartitionRules& rules, std::string_view leaf_path,
                                        const Shape& shape, const RuleOptions& options) {
  const std::string leaf = "leaf '" + std::string(leaf_path) + "'";
  std::optional<uint64_t> count = checked_num_bytes(shape);
  if (!count)
    return invalid_argument(leaf + ": shape " + shape_to_string(shape) +
                            " has a negative dimension or too many elements");
  RuleMatch m;
  // eformer strict: a scalar is replicated before any rule is consulted, so
  // a scalar no rule matches is not an error.
  if (options.strict && shape.empty()) return m;
  const std::string text = rule_match_path(leaf_path);
  std::optional<size_t> hit = rules.first_match(text);
  if (!hit)
    return invalid_argument("no partition rule matches " + leaf + " (as '" + text + "'); add a catch-all "
                            "rule such as [\".*\", []] to replicate what no other rule names");
  m.rule_index = static_cast<int64_t>(*hit);
  m.spec = rules.rules()[*hit].spec;
  if (!options.strict) return m;
  // eformer checks the size only once a rule matched: a small leaf no rule
  // names is still an error.
  if (*count < static_cast<uint64_t>(std::max<int64_t>(options.min_size, 0))) {
    m.spec = PartitionSpec{};
    m.small = true;
    return m;
  }
  if (m.spec.size() > shape.size()) {  // eformer keeps the first ndim entries
    m.spec.dims.resize(shape.size());
    m.trimmed = true;
  }
  return m;
}

}  // namespace ckptio
