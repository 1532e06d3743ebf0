// How damage to a committed step is reported. A committed index promises its
// data files at their recorded sizes, so reading one that is missing or too
// short is data loss, not "not found": the step is damaged. That keeps one
// rule for everything that decides between falling back and failing
// (restore-latest, discovery): Status::data_loss().
#pragma once

#include <string>

#include "ckptio/status.h"

namespace ckptio {

// The error of a failed read of a committed step's data object `location`
// (storage description + key), in `context` ("restore model/w shard 0 (file
// data-ab-0.bin, bytes [0, 4096)) of step 5"). A missing object becomes
// kDataLoss "…: data file <location> is missing"; every other error keeps its
// code (a read past the end is kDataLoss already; kUnavailable, kIOError and
// kPermissionDenied stay what they are and never make a step look damaged).
inline Status data_read_error(const Status& st, const std::string& context, const std::string& location) {
  if (st.code() == Code::kNotFound)
    return Status(Code::kDataLoss, context + ": data file " + location + " is missing (" + st.message() + ")");
  return st.annotate(context);
}

// "bytes [offset, offset + length)".
inline std::string byte_range(uint64_t offset, uint64_t length) {
  return "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
}

}  // namespace ckptio
