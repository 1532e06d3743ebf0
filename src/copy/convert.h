// Copies that change the layout (CopyOptions::format): a ckptio step into
// eformer's zarr layout and back. Unlike a same-layout copy, which streams
// the data files byte for byte (copy_stream.cc), a conversion decodes the
// leaves and encodes them again:
//   - the source's leaves are restored whole, in groups of at most half of
//     CopyOptions::max_memory bytes (a larger leaf alone), through the
//     restore paths (restore_whole.cc, checksums checked; restore_zarr.cc,
//     chunks decoded), the next group on a thread of its own while the
//     calling thread writes the last one;
//   - eformer -> ckptio: each group's leaves are appended to one data file
//     through a few aligned buffers, each leaf one shard with its crc32c; the
//     index is written and the step committed by the destination's protocol
//     (src/save/commit.h), as a save would;
//   - ckptio -> eformer: each leaf is one zarr array whose chunks are the
//     saved shards' shape when those form a regular grid (else the whole
//     leaf), encoded with zstd at CopyOptions::zstd_level and committed by
//     EformerStepWriter (src/save/eformer_writer.h).
// Values are bit-exact both ways; memory stays within about max_memory plus
// the two largest leaves, plus the eformer writer's own bound
// (EformerWriteOptions::max_pending_bytes, and half as much pooled).
#pragma once

#include <string>

#include "ckptio/copy.h"
#include "ckptio/index.h"
#include "ckptio/storage.h"

namespace ckptio {

// Converts the committed step `index` (read from `src` at `src_dir`) into
// `layout` ("ckptio" or "eformer") at `dst` under `dst_dir`. The caller has
// checked what the destination holds (overwrite).
Result<CopyStats> convert_step(Storage& src, const std::string& src_dir, const Index& index, Storage& dst,
                               const std::string& dst_dir, const std::string& layout, const CopyOptions& o);

}  // namespace ckptio
