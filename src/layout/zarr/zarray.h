// A zarr v2 array's metadata (`.zarray`): the reader, and the writer of the
// text TensorStore writes. The layout eformer / JAX checkpoints use
// (docs/format.md will describe it; issue 29):
//
//   <step>/model/layers/0/kernel/.zarray   {"chunks":[256,4096],"compressor":{"id":"zstd","level":1},...}
//   <step>/model/layers/0/kernel/0.0       one chunk: the compressed C-order bytes of a
//   <step>/model/layers/0/kernel/1.0       full chunk box (edge chunks too, padded)
//
// How a zarr array will feed the read executor (src/restore/read_executor.h;
// not wired yet). A chunk is the unit of storage and of decoding, so it is the
// unit of reading: a piece is one whole chunk object, whose size comes from
// the listing (Storage::list gives each key's size), never a byte range
// inside it (a compressed stream cannot be entered in the middle).
//   - Planning: for each target box, chunks_overlapping() (chunk_grid.h)
//     names the chunks it needs; each needed chunk is read once, as one
//     ExecRead of [0, object size) of its own numbered file (the chunk key),
//     however many targets (replicas, overlapping boxes) need it.
//   - Transform: a decompressing transform per piece (chunk_codec.h) turns the
//     landed compressed bytes into the chunk's full decoded box (chunk_bytes
//     of C-order elements, edge chunks included, whose padding is dropped),
//     into a scratch buffer of the worker that decodes it; or straight into
//     the destination when the chunk's valid box is one contiguous run of a
//     single target (a row band of a C-order leaf: the common whole-leaf case).
//     Decoding runs on worker threads between delivery and copy-out (the
//     executor delivers on one thread), with one ChunkDecoder per worker.
//   - Copy-out: per (chunk, target) pair, run_layout(full chunk box, 0,
//     intersect(valid box, target), target, element size) from
//     src/util/box_runs.h gives the strided runs from the decoded chunk to the
//     target, exactly as for a ckptio shard at offset 0 of a file; the full
//     (padded) box is the source layout, so edge chunks need no special case.
// There is no checksum in zarr: such pieces are delivered unverified, and a
// decode whose size is not chunk_bytes is the only integrity check.
//
// Errors: text that is not a valid .zarray (bad JSON, wrong types, negative
// or overflowing shapes, zero chunk dimensions, unknown dtype or compressor)
// is kDataLoss, like a damaged ckptio index; a valid zarr array that ckptio
// cannot read yet (big-endian, order "F" with more than one non-trivial chunk
// dimension, filters, int4 and other dtypes without a ckptio DType, structured
// dtypes) is kUnimplemented. Messages quote the offending text, made printable
// and short.
//
// Thread safety: pure functions; a ZArray is a value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio::zarr {

// numcodecs' codec ids, as far as ckptio reads them.
enum class CodecId : uint8_t { kNone, kZstd, kBlosc, kZlib, kGzip };

struct Compressor {
  CodecId id = CodecId::kNone;
  // zstd: level (TensorStore's default 1; numcodecs' 1 too); zlib, gzip:
  // level 0..9; blosc: clevel 0..9.
  int level = 1;
  // blosc only (numcodecs / TensorStore defaults: lz4, shuffle -1 = byte
  // shuffle unless the item size is 1, blocksize 0 = automatic). Decoding
  // needs none of them: a blosc frame's header says how it was made.
  std::string cname = "lz4";
  int shuffle = -1;
  uint64_t blocksize = 0;
  bool operator==(const Compressor&) const = default;
};

// JSON's fill_value: null, a number, or one of TensorStore's / zarr's strings
// "NaN", "Infinity", "-Infinity"; `true`/`false` for bool arrays; [re, im]
// for complex ones.
struct FillValue {
  enum class Kind : uint8_t { kNull, kInt, kUInt, kFloat, kBool };
  Kind kind = Kind::kNull;
  int64_t i = 0;     // kInt
  uint64_t u = 0;    // kUInt (integers above INT64_MAX)
  double f = 0;      // kFloat: any double, NaN and infinities included
  double f_im = 0;   // complex: the imaginary part (kind is then kFloat)
  bool b = false;    // kBool
  bool operator==(const FillValue& o) const;
};

enum class Order : uint8_t { kC, kF };

struct ZArray {
  Shape shape;
  Shape chunks;            // every entry >= 1
  DType dtype = DType::kFloat32;
  std::string dtype_text;  // as written: "<f4", "|b1", "bfloat16"
  Compressor compressor;
  Order order = Order::kC;
  FillValue fill_value;
  char separator = '.';    // dimension_separator: '.' (the default) or '/'

  // Derived by parse_zarray / make_zarray:
  std::vector<uint64_t> grid;  // chunks per dimension: ceil(shape / chunks)
  uint64_t num_chunks = 0;     // product of grid (1 for rank 0)
  uint64_t chunk_elements = 0; // elements of one full chunk
  uint64_t chunk_bytes = 0;    // decoded bytes of one full chunk (edge chunks too)

  bool operator==(const ZArray&) const = default;
};

struct ZArrayLimits {
  uint64_t max_bytes = 1 << 20;          // of the .zarray text
  uint32_t max_rank = 32;
  // A chunk is decoded whole into memory: larger ones are refused (JAX
  // targets chunks of at most ~2.2 GB).
  uint64_t max_chunk_bytes = 16ull << 30;
};

// Parses a .zarray. See the errors above. Checks, besides types: rank equal
// in shape and chunks and at most max_rank; the array's bytes, the padded
// grid's extent and bytes (grid * chunks * itemsize) fit in 64 bits; a
// chunk's bytes fit max_chunk_bytes; zarr_format is 2; filters null or [];
// the fill value fits the dtype. Keys zarr does not define are ignored (as
// TensorStore keeps them as extra members).
Result<ZArray> parse_zarray(std::string_view text, const ZArrayLimits& limits = {});

// A ZArray with its derived fields, from the fields a writer chooses
// (dtype_text is set from dtype). kInvalidArgument for what parse_zarray
// would refuse.
Result<ZArray> make_zarray(Shape shape, Shape chunks, DType dtype, Compressor compressor,
                           char separator = '.', const ZArrayLimits& limits = {});

// The .zarray text as TensorStore writes it: nlohmann-json's compact dump,
// keys sorted, dimension_separator always present, filters null, e.g.
//   {"chunks":[2,3],"compressor":{"id":"zstd","level":1},"dimension_separator":".","dtype":"<f4",
//    "fill_value":null,"filters":null,"order":"C","shape":[4,3],"zarr_format":2}  (one line)
std::string serialize_zarray(const ZArray& a);

// The zarr dtype string TensorStore writes for a ckptio dtype: a numpy
// typestr ("<f4", "|b1", "<c8") or a bare name ("bfloat16",
// "float8_e4m3fn", "float8_e5m2").
std::string_view zarr_dtype_string(DType t);
// The ckptio dtype of a zarr dtype string: kDataLoss if it is no dtype zarr
// or TensorStore writes, kUnimplemented if ckptio has none for it (int4,
// the fnuz float8 kinds, big-endian, strings, datetimes).
Result<DType> parse_zarr_dtype(std::string_view s);

// One element holding the fill value in `a.dtype`'s bytes (little-endian),
// or an empty vector when fill_value is null (a missing chunk then has no
// defined contents: TensorStore reads zeros, zarr-python leaves them unset).
// kUnimplemented for a float8 fill value other than 0, -0, NaN and (e5m2)
// the infinities.
Result<std::vector<std::byte>> fill_value_bytes(const ZArray& a);

}  // namespace ckptio::zarr
