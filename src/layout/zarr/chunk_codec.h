// Decoding and encoding one zarr chunk: zstd (libzstd), blosc (libblosc),
// zlib and gzip (zlib), or none.
//
// Decoding is bounded by the caller: the chunk decodes into `dst`, whose
// size is the exact decoded size expected (ZArray::chunk_bytes), and nothing
// is allocated in proportion to what the compressed bytes claim. A frame
// that declares another size is refused before any decoding (zstd: the
// frame headers' content sizes; blosc: its header's nbytes and cbytes); a
// stream without a declared size (zstd frames written by a streaming
// encoder, zlib, gzip) is decoded into `dst` and refused as soon as it would
// overflow it, or if it ends short of it. Trailing bytes after the stream
// are refused too. Every refusal is kDataLoss naming what was wrong; `dst`
// may then hold partial output.
//
// Thread safety: a ChunkDecoder or ChunkEncoder holds its codec contexts
// (reused from chunk to chunk) and is used by one thread at a time; any
// number of them run at once (no global state: blosc through its _ctx
// functions). decode_chunk() and encode_chunk() make a temporary one.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "ckptio/status.h"
#include "src/layout/zarr/zarray.h"

namespace ckptio::zarr {

class ChunkDecoder {
 public:
  ChunkDecoder();
  ~ChunkDecoder();
  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Decodes `src` (one stored chunk) into exactly dst.size() bytes.
  Status decode(const Compressor& c, std::span<const std::byte> src, std::span<std::byte> dst);

 private:
  struct Contexts;
  std::unique_ptr<Contexts> ctx_;
};

class ChunkEncoder {
 public:
  ChunkEncoder();
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Encodes `src` into *out (resized to the encoded size; its capacity is
  // kept from call to call). zstd (one frame with its content size, at
  // c.level; the save side's default is 1, as TensorStore's) and none;
  // kUnimplemented for the others.
  Status encode(const Compressor& c, std::span<const std::byte> src, std::vector<std::byte>* out);
  // As encode(), into `dst` (at least encoded_bound(c, src.size()) bytes):
  // the encoded size. Lets a caller encode straight into a buffer it writes
  // from (the eformer writer's aligned, pooled chunk buffers).
  Result<size_t> encode_into(const Compressor& c, std::span<const std::byte> src, std::span<std::byte> dst);

 private:
  struct Contexts;
  std::unique_ptr<Contexts> ctx_;
};

// The most bytes encoding `n` bytes with `c` can produce (zstd's
// ZSTD_compressBound; n for none); kInvalidArgument when zstd cannot bound it.
Result<size_t> encoded_bound(const Compressor& c, size_t n);

// Whether `stored` bytes can be a chunk of `decoded` bytes with `c`, from
// the sizes alone: none stores exactly `decoded`; the others at most any
// codec's worst expansion, and at least 1/32768 of it (zstd's best ratio).
// kDataLoss otherwise. For a caller to check a listed chunk before it
// allocates for reading it (a sparse terabyte file) or for decoding it (a
// few bytes claiming gigabytes).
Status check_stored_size(const Compressor& c, uint64_t stored, uint64_t decoded);
// check_stored_size, then what the chunk's headers declare (zstd frames'
// content sizes, blosc's header): every check decode() makes before it
// writes a byte, for a caller to make before it allocates `decoded` bytes.
Status check_chunk(const Compressor& c, std::span<const std::byte> src, uint64_t decoded);

Status decode_chunk(const Compressor& c, std::span<const std::byte> src, std::span<std::byte> dst);
Status encode_chunk(const Compressor& c, std::span<const std::byte> src, std::vector<std::byte>* out);

}  // namespace ckptio::zarr
