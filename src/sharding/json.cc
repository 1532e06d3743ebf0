// PartitionSpec and partition rules as JSON, the way Python writes them:
// json.dumps(PartitionSpec(None, "tp", ("dp", "tp"))) is [null, "tp",
// ["dp", "tp"]] because a PartitionSpec is a tuple, and a rules list
// [(regex, spec), ...] becomes [[regex, spec], ...].
//
// Both readers are total: the text is screened for size and nesting before
// nlohmann-json sees it (so a hostile file cannot recurse deeply or allocate
// much), nlohmann's exceptions are caught here, and every rejection names its
// JSON location.
#include <nlohmann/json.hpp>

#include <new>

#include "ckptio/sharding.h"
#include "src/util/json_scan.h"
#include "src/util/json_free.h"

namespace ckptio {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxSpecBytes = size_t{1} << 20;
constexpr size_t kMaxRulesBytes = size_t{16} << 20;
constexpr size_t kMaxRules = 100'000;
// A spec is an array of (arrays of) names; a rules file wraps it in two more.
constexpr int kSpecDepth = 2;
constexpr int kRulesDepth = 4;

// Parses into `out` (which the caller frees with a JsonFreer).
Status parse_screened(std::string_view text, size_t max_bytes, int max_depth, const std::string& root, Json* out) {
  if (text.size() > max_bytes)
    return invalid_argument(root + ": " + std::to_string(text.size()) + " bytes, more than the limit of " +
                            std::to_string(max_bytes));
  if (size_t at = find_excess_depth(text, max_depth); at != std::string_view::npos)
    return invalid_argument(root + ": JSON nested deeper than " + std::to_string(max_depth) +
                            " levels at byte " + std::to_string(at));
  try {
    parse_json_into(*out, text);
    return Status::OK();
  } catch (const Json::parse_error& e) {
    return invalid_argument(root + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return out_of_memory("parse " + root);
  } catch (const std::exception& e) {
    return invalid_argument(root + ": cannot parse: " + e.what());
  }
}

std::string got(const Json& j) { return std::string("got ") + j.type_name(); }

Result<std::string> read_axis_name(const Json& j, const std::string& at) {
  if (!j.is_string()) return invalid_argument(at + ": expected an axis name (a string), " + got(j));
  std::string name = j.get<std::string>();
  if (name.empty()) return invalid_argument(at + ": axis names are non-empty");
  return name;
}

Result<PartitionSpec> read_spec(const Json& j, const std::string& at) {
  if (!j.is_array())
    return invalid_argument(at + ": expected a PartitionSpec as an array of entries (null, \"axis\" or "
                            "[\"axis\", ...]), " + got(j));
  PartitionSpec spec;
  spec.dims.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& e = j[i];
    const std::string eat = at + "[" + std::to_string(i) + "]";
    DimSharding dim;
    if (e.is_null()) {
      // None: not split.
    } else if (e.is_string()) {
      CKPTIO_ASSIGN_OR_RETURN(std::string name, read_axis_name(e, eat));
      dim.axes.push_back(std::move(name));
    } else if (e.is_array()) {  // a tuple of axes, major to minor; () reads as None
      for (size_t k = 0; k < e.size(); ++k) {
        CKPTIO_ASSIGN_OR_RETURN(std::string name, read_axis_name(e[k], eat + "[" + std::to_string(k) + "]"));
        dim.axes.push_back(std::move(name));
      }
    } else {
      return invalid_argument(eat + ": expected null, an axis name or an array of axis names, " + got(e));
    }
    spec.dims.push_back(std::move(dim));
  }
  return spec;
}

Result<std::vector<PartitionRule>> read_rules(const Json& j) {
  if (!j.is_array()) return invalid_argument("rules: expected an array of [regex, spec] pairs, " + got(j));
  if (j.size() > kMaxRules)
    return invalid_argument("rules: " + std::to_string(j.size()) + " rules, more than the limit of " +
                            std::to_string(kMaxRules));
  std::vector<PartitionRule> rules;
  rules.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& pair = j[i];
    const std::string at = "rules[" + std::to_string(i) + "]";
    if (!pair.is_array() || pair.size() != 2)
      return invalid_argument(at + ": expected a [regex, spec] pair, " +
                              (pair.is_array() ? "got an array of " + std::to_string(pair.size()) : got(pair)));
    if (!pair[0].is_string()) return invalid_argument(at + "[0]: expected the regex as a string, " + got(pair[0]));
    PartitionRule rule;
    rule.regex = pair[0].get<std::string>();
    CKPTIO_ASSIGN_OR_RETURN(rule.spec, read_spec(pair[1], at + "[1]"));
    rules.push_back(std::move(rule));
  }
  return rules;
}

}  // namespace

Result<PartitionSpec> parse_partition_spec_json(std::string_view json) {
  try {
    Json j;
    JsonFreer free_j(j);
    CKPTIO_RETURN_IF_ERROR(parse_screened(json, kMaxSpecBytes, kSpecDepth, "spec", &j));
    return read_spec(j, "spec");
  } catch (const std::bad_alloc&) {  // nothing else throws
    return out_of_memory("parse spec");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("spec: ") + e.what());
  }
}

Result<PartitionRules> PartitionRules::from_json(std::string_view json) {
  std::vector<PartitionRule> rules;
  try {
    Json j;
    JsonFreer free_j(j);
    CKPTIO_RETURN_IF_ERROR(parse_screened(json, kMaxRulesBytes, kRulesDepth, "rules", &j));
    CKPTIO_ASSIGN_OR_RETURN(rules, read_rules(j));
  } catch (const std::bad_alloc&) {
    return out_of_memory("parse rules");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("rules: ") + e.what());
  }
  return compile(std::move(rules));
}

std::string PartitionSpec::to_json() const {
  Json j = Json::array();
  JsonFreer free_j(j);
  for (const DimSharding& d : dims) {
    if (d.axes.empty()) j.push_back(nullptr);
    else if (d.axes.size() == 1) j.push_back(d.axes[0]);
    else j.push_back(d.axes);
  }
  // replace: a name that is not UTF-8 must not make dump() throw.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ckptio
