// The index's public entry points (include/ckptio/index.h): parse_index and
// the choice between its two readers, serialize_index, check_metadata_json,
// and the small functions of the index records. docs/format.md is the
// contract they implement.
//
// parse_index first tries the fast reader (fast_reader.cc), which takes the
// plain form that serialize_index (serialize.cc) writes and gives up on
// anything else; then the strict reader (strict_reader.cc), which reads
// every valid index and names the location of every rejection. Neither
// builds a JSON tree, and no exception escapes: nothing in src/index/ throws
// on purpose, and the entry points here catch what is left (allocation
// failure).
#include "ckptio/index.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "src/index/index_internal.h"
#include "src/index/index_readers.h"

namespace ckptio {

uint64_t LeafRecord::num_bytes() const {
  return checked_num_bytes(shape, dtype_size(dtype)).value_or(UINT64_MAX);
}

uint64_t Index::total_bytes() const {
  uint64_t total = 0;
  for (const auto& p : prefixes)
    for (const auto& l : p.leaves)
      for (const auto& s : l.shards)
        if (__builtin_add_overflow(total, s.length, &total)) return UINT64_MAX;
  return total;
}

bool is_safe_relative_name(std::string_view name) {
  if (name.empty() || name.front() == '/') return false;
  if (name.find('\0') != std::string_view::npos || name.find('\\') != std::string_view::npos)
    return false;
  size_t begin = 0;
  while (true) {  // each '/'-separated component
    const size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part = name.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    if (end == name.size()) return true;
    begin = end + 1;
  }
}

namespace index_readers {

Result<Index> parse_index_arriving(std::string_view json, size_t loaded, const std::function<Status()>& rest,
                                   const IndexLimits& limits, std::optional<size_t> split) {
  try {
    index_internal::Arriving arriving;
    arriving.loaded = std::min(loaded, json.size());
    arriving.rest = &rest;
    Index index;
    // It returns with its helper joined, so bring() below cannot race it.
    const bool taken = index_internal::read_index_fast_arriving(json, limits, &index, split, &arriving);
    if (!arriving.bring()) return arriving.status;
    if (taken) return index;
    return read_index_strict(json, limits);
  } catch (const std::bad_alloc&) {  // nothing else throws
    return out_of_memory("parse_index: " + std::to_string(json.size()) + " bytes of index");
  } catch (const std::exception& e) {
    return Status(Code::kInternal, std::string("parse_index: ") + e.what());
  }
}

}  // namespace index_readers

Result<Index> parse_index(std::string_view json, const IndexLimits& limits) {
  try {
    Index index;
    if (index_readers::read_index_fast(json, limits, &index)) return index;
    return index_readers::read_index_strict(json, limits);
  } catch (const std::bad_alloc&) {  // nothing else throws
    return out_of_memory("parse_index: " + std::to_string(json.size()) + " bytes of index");
  } catch (const std::exception& e) {
    return Status(Code::kInternal, std::string("parse_index: ") + e.what());
  }
}

std::string serialize_index(const Index& index) {
  try {
    return index_internal::serialize(index);
  } catch (const std::exception&) {
    return std::string();  // allocation failure: an empty text no reader accepts
  }
}

Status check_metadata_json(std::string_view json) {
  try {
    auto canonical = index_internal::read_metadata(json);
    return canonical.ok() ? Status::OK() : invalid_argument(canonical.status().message());
  } catch (const std::bad_alloc&) {
    return out_of_memory("check_metadata_json");
  } catch (const std::exception& e) {
    return Status(Code::kInternal, std::string("check_metadata_json: ") + e.what());
  }
}

}  // namespace ckptio
