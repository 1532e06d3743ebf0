// Restore and verify of steps in the eformer / zarr v2 layout (Index::layout
// "eformer", loaded by src/layout/zarr/eformer_step.h): the part of
// CheckpointManager::restore and ::verify that runs once the step is chosen,
// its index built, the leaves selected and checked against the template.
//
// A chunk is the unit of storage and of decoding, so it is the unit of
// reading: per leaf, the chunks its targets overlap (the whole leaf, or the
// boxes of this process's devices in a sharding) are read once each, whole,
// through the read executor (src/restore/read_executor.h) into buffers of
// their own, and decoded (src/layout/zarr/chunk_codec.h) on a crew of one
// thread per core while the next chunks are read. A chunk decodes straight
// into its target when it is one contiguous run of it (a row band of a
// whole leaf, no cast); otherwise into the decoding thread's scratch, from
// which its runs are copied (through the cast, if any) into each target it
// overlaps. Compressed chunks read and not yet decoded are bounded
// (256 MiB, or one chunk if larger).
//
// zarr has no checksums: every chunk delivered counts in
// RestoreStats::pieces_unverified / bytes_unverified; a chunk whose decoded
// size is not the chunk's is kDataLoss naming it. A chunk the store lacks is
// kDataLoss before any read, unless RestoreOptions::fill_missing_chunks.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/manager.h"
#include "ckptio/storage.h"

namespace ckptio {

// Fills out->leaves (whole tensors, or device_shards with options.sharding)
// and out->stats (all but index_seconds and seconds).
Status restore_zarr(Storage& storage, const std::string& step_dir, int64_t step,
                    const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                    const RestoreOptions& options, RestoredState* out);

// Reads and decodes every chunk of the step, checking each decodes to its
// size; lists every damaged or missing chunk (up to 20 named) in one
// kDataLoss instead of stopping at the first.
Status verify_zarr(Storage& storage, const std::string& step_dir, const Index& index,
                   const ProgressHook& on_progress);

}  // namespace ckptio
