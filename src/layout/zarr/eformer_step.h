// A step eformer (JAX's TensorStore serialization, zarr v2) wrote, read into
// ckptio's index model (include/ckptio/index.h, Index::layout "eformer"), so
// that discovery, restore (any subset, any sharding), verify, ls and inspect
// treat it as they treat a step of their own.
//
//   <base>/run-12/metadata.json            {"step": 12, "timestamp": "...", "is_temporary": false}
//   <base>/run-12/tensorstore_index.json   which arrays, in which prefixes (or <prefix>_tensorstore_index.json)
//   <base>/run-12/model/layers/0/kernel/.zarray, 0.0, 0.1, ...   one zarr v2 array per leaf
//
// eformer has no commit record: it writes the arrays, then the index, then
// metadata.json. A step counts as complete (committed, for ckptio) when
// metadata.json is there (is_temporary only marks a step eformer's manager
// may delete later: it is whole), an index is there, and every array
// the index lists has its .zarray; missing chunks are found by the restore
// that needs them. A step that is not complete is "in progress"
// (kNotFound): never damage, since nothing atomic ever made it whole.
//
// One listing of the step (recursive) gives every object and its size; the
// .zarray files are then read in one parallel Storage::read. Each leaf's
// shards are the chunks the listing holds (chunk keys parsed against the
// leaf's grid; other names inside an array's directory, such as .zattrs,
// are ignored).
//
// Errors: a complete step whose files are invalid (index, metadata, a
// .zarray, an index entry whose shape or dtype disagrees with its .zarray,
// a chunk key outside the grid) is kDataLoss naming the file, as for a
// damaged ckptio index; what ckptio cannot read yet is kUnimplemented.
//
// Thread safety: pure functions over the given Storage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/status.h"
#include "ckptio/storage.h"

namespace ckptio::zarr {

inline constexpr const char* kEformerLayout = "eformer";

// True if the objects of a step directory (keys as listed, `dir` + "/" ...)
// show eformer's layout: a metadata.json, an eformer index or a .zarray.
bool looks_like_eformer_step(const std::string& dir, const std::vector<ListEntry>& objects);

// True if those objects are a step eformer's writer began and never
// finished: eformer's layout, no metadata.json (eformer's commit marker),
// and nothing but what the writer writes (.zarray files, indexes, chunk
// keys such as "0.1" or "0/1"). On an object store the writer writes under
// the step's own prefix, so a killed save leaves this (a user's other
// files under a step's name never match).
bool is_unfinished_eformer_step(const std::string& dir, const std::vector<ListEntry>& objects);

// The step at `dir` ("run-12"; `step` parsed from the name) as an Index:
// nullopt when the directory holds no eformer step; kNotFound (naming what
// is missing) when it holds one that is not complete; the Index otherwise.
Result<std::optional<Index>> load_eformer_step(Storage& storage, const std::string& dir, int64_t step);

}  // namespace ckptio::zarr
