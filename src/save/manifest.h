// Manifests of a multi-process save (docs/multiprocess.md): what one process
// wrote for a step, for the coordinator to merge into the step's index.
//
// A manifest is an index document (docs/format.md) whose shards may leave
// holes (IndexLimits::partial_cover), with the process's identity in its
// metadata under "ckptio_manifest":
//   {"ckptio_manifest": {"attempt": "<16 hex>", "process_index": 3,
//                        "process_count": 8, "error": null | "message"}}
// A process that failed writes a manifest with an error and no leaves, so
// the coordinator fails the step at once instead of waiting for a timeout.
// The reader is the index parser itself (strict, bounded, fuzzed) plus the
// checks of those four fields.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/status.h"

namespace ckptio {

struct Manifest {
  std::string attempt;
  int process_index = 0;
  int process_count = 1;
  std::optional<std::string> error;  // the process failed: why
  Index index;  // this process's leaves and data files; metadata_json unused
};

// At most this much of another process's error (a manifest's, a failure
// record's) is quoted in this process's, through printable(): it was read
// from the storage.
inline constexpr size_t kQuotedErrorMax = 4096;
// The most processes a manifest may name (ProcessGroup::count is checked
// against it: a larger group's every save failed on its own manifests).
inline constexpr int64_t kMaxGroupProcesses = int64_t{1} << 20;

std::string serialize_manifest(const Manifest& m);
// kDataLoss naming the problem (the index parser's location, or the field).
Result<Manifest> parse_manifest(std::string_view json);

// Object names inside a step's staging directory (POSIX) or step prefix
// (object stores).
std::string manifest_name(const std::string& attempt, int process_index);
std::string manifest_prefix(const std::string& attempt);  // of every manifest of the attempt
std::string failure_name(const std::string& attempt);

// Merges the manifests of every process (one per index 0 .. count-1, any
// order) into a step's index, and proves that the shards of every leaf cover
// it exactly once. Errors (kFailedPrecondition) name the leaf and the region:
// "model/params.w: elements [0:4, 8:16] are written by processes 1 and 3",
// "... are written by no process"; or a leaf whose dtype or shape differs
// between processes; or a manifest that reports an error.
Result<Index> merge_manifests(std::vector<Manifest> manifests);

// The first problem with how `boxes` cover `shape` exactly once, as
// "elements [a:b, c:d] are ..." text, or nullopt when they do. `owner[i]`
// names who wrote boxes[i] (for messages). Empty boxes are ignored.
std::optional<std::string> describe_cover_problem(const Shape& shape, const std::vector<Box>& boxes,
                                                  const std::vector<std::string>& owner);

}  // namespace ckptio
