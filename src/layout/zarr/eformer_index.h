// eformer's step files: `tensorstore_index.json` (which arrays a step holds),
// the older `<prefix>_tensorstore_index.json`, and `metadata.json` (step,
// timestamp, temporary). Readers and writers; erfanzar/eformer's
// eformer/serialization/serialization.py (tree_serialize_leaves) and
// checkpointer.py (_write_checkpoint_metadata) are the reference.
//
//   {"format": "tensorstore", "version": "0.0.95",
//    "prefixes": {"model": [{"path": "model/layers/0/kernel", "shape": [4, 8], "dtype": "bfloat16"}, ...],
//                 "tx": [...]},
//    "arrays": [...]}          (arrays saved without a prefix; may sit beside "prefixes")
//
// An array's path is its directory under the step: eformer joins the leaf's
// key path with "." ("model.layers.0.kernel") and makes each part a directory
// ("model/layers/0/kernel"); the reader turns "/" back into ".". That
// directory holds the zarr array (.zarray, chunks). Readers branch on
// "prefixes" / "arrays", never on "version" (eformer writes its package
// version there; early files say "2.0"). `<prefix>_structure.json` holds
// pickled Python objects: ckptio never reads it.
//
// Storage keys come from these paths, so a path must stay inside the step:
// relative, '/'-separated, no empty, "." or ".." component, no backslash, no
// NUL or other control byte; and no array's directory may lie inside
// another's (their chunk keys could collide). A refusal is kDataLoss naming
// the entry.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio::zarr {

inline constexpr std::string_view kEformerIndexName = "tensorstore_index.json";
inline constexpr std::string_view kEformerMetadataName = "metadata.json";

struct EformerArray {
  std::string path;   // the array's directory under the step: "model/layers/0/kernel"
  Shape shape;
  std::string dtype_name;        // as written: numpy's str(dtype), "bfloat16", "float32"
  std::optional<DType> dtype;    // nullopt when ckptio has no such dtype (the
                                 // .zarray decides whether the array is readable)
  bool operator==(const EformerArray&) const = default;
};

struct EformerPrefix {
  std::string name;
  std::vector<EformerArray> arrays;
  bool operator==(const EformerPrefix&) const = default;
};

struct EformerIndex {
  std::string version = "2.0";
  std::vector<EformerPrefix> prefixes;            // in file order
  std::optional<std::vector<EformerArray>> arrays;  // the top-level "arrays", when present
  bool operator==(const EformerIndex&) const = default;
};

struct EformerIndexLimits {
  uint64_t max_bytes = 256ull << 20;
  uint32_t max_rank = 32;
  uint64_t max_arrays = 10'000'000;
};

// tensorstore_index.json. Keys other than format, version, prefixes and
// arrays are ignored; "format" must be "tensorstore".
Result<EformerIndex> parse_eformer_index(std::string_view text, const EformerIndexLimits& limits = {});

// The older per-prefix file `<prefix>_tensorstore_index.json`: the same
// document, its arrays (top-level "arrays") belonging to `prefix`. The result
// has that one prefix and no top-level arrays.
Result<EformerIndex> parse_eformer_prefix_index(std::string_view prefix, std::string_view text,
                                                const EformerIndexLimits& limits = {});

// "model_tensorstore_index.json" -> "model"; nullopt for any other name
// (tensorstore_index.json itself included).
std::optional<std::string> prefix_of_index_name(std::string_view file_name);

// The text eformer writes: Python's json.dumps(index, indent=2) (ASCII,
// keys in the order format, version, prefixes, arrays; "prefixes" always
// present, as eformer starts every index with it).
std::string serialize_eformer_index(const EformerIndex& index);

// The array directory of a leaf's dotted key path ("model.layers.0.kernel" ->
// "model/layers/0/kernel"), checked as check_array_path does.
Result<std::string> array_dir_of_key_path(std::string_view key_path);
// The dotted key path of an array directory (eformer's reader: "/" -> ".").
std::string key_path_of_array_dir(std::string_view path);
// OK if `path` is a safe array directory (rules above), else kDataLoss.
Status check_array_path(std::string_view path);
// No two of the arrays' directories alike, and none inside another's
// (kDataLoss naming them): each index file is checked on its own, and a step
// read from several (older per-prefix files) across all of them.
Status check_array_dirs(std::vector<std::string_view> paths);

// metadata.json of a step. eformer writes all three; EasyDeL adds keys (kept
// out of this struct, ignored). Each is optional here, with its type checked
// when present: the discovery that needs them says which it requires.
struct EformerStepMetadata {
  std::optional<int64_t> step;
  std::optional<std::string> timestamp;  // ISO 8601, as datetime.isoformat() writes it
  std::optional<bool> is_temporary;
  bool operator==(const EformerStepMetadata&) const = default;
};
Result<EformerStepMetadata> parse_eformer_metadata(std::string_view text);
// As eformer writes it: json.dump of {"step", "timestamp", "is_temporary"}
// (Python's default separators ", " and ": "; absent fields left out).
std::string serialize_eformer_metadata(const EformerStepMetadata& m);

}  // namespace ckptio::zarr
