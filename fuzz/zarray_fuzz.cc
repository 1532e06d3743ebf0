// Fuzzes the .zarray reader (src/layout/zarr/zarray.h) and the chunk
// geometry built on what it accepts (chunk_grid.h).
//
// Properties checked on every input:
//   - parse_zarray never crashes, hangs, leaks or trips a sanitizer, and
//     never allocates by what the text claims (a chunk grid is never
//     enumerated here, only its first and last chunk);
//   - a rejection is kDataLoss (not a .zarray) or kUnimplemented (valid zarr
//     ckptio cannot read), with a message free of control bytes;
//   - an accepted array is what the header promises: rank of shape = rank of
//     chunks <= 32, shape >= 0, chunks >= 1, grid = ceil(shape / chunks),
//     num_chunks and chunk_bytes their products (no overflow), chunk_bytes
//     within the limit, the array's and the padded grid's bytes in 64 bits;
//   - it round-trips: parse(serialize(x)) == x, and serializing again gives
//     the same text;
//   - the geometry agrees: the whole array overlaps exactly num_chunks
//     chunks; the last chunk's full box contains its valid box, which lies
//     inside the shape and is not empty; its key has rank - 1 separators;
//   - fill_value_bytes gives one element or nothing, or kUnimplemented.
// Any violation calls abort(), so libFuzzer records the input as a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/zarray.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "zarray_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_geometry(const ckptio::zarr::ZArray& a, const std::string& text) {
  using namespace ckptio::zarr;
  const size_t rank = a.shape.size();
  if (rank != a.chunks.size() || rank > 32 || a.grid.size() != rank) fail("accepted a bad rank", text);
  uint64_t n = 1, elements = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (a.shape[d] < 0 || a.chunks[d] < 1) fail("accepted a negative shape or a zero chunk", text);
    const uint64_t s = static_cast<uint64_t>(a.shape[d]), c = static_cast<uint64_t>(a.chunks[d]);
    if (a.grid[d] != s / c + (s % c != 0)) fail("grid is not ceil(shape / chunks)", text);
    if (__builtin_mul_overflow(n, a.grid[d], &n) || __builtin_mul_overflow(elements, c, &elements))
      fail("accepted an overflowing grid", text);
  }
  if (n != a.num_chunks || elements != a.chunk_elements) fail("num_chunks or chunk_elements wrong", text);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, ckptio::dtype_size(a.dtype), &bytes) || bytes != a.chunk_bytes)
    fail("chunk_bytes wrong", text);
  if (a.chunk_bytes > ZArrayLimits{}.max_chunk_bytes) fail("accepted a chunk above the limit", text);
  if (!ckptio::checked_num_bytes(a.shape, ckptio::dtype_size(a.dtype))) fail("accepted an overflowing shape", text);

  auto all = chunks_overlapping(a, ckptio::Box::whole(a.shape));
  if (!all.ok()) fail("chunks_overlapping refused the whole array", all.status().to_string());
  if (all->count != a.num_chunks) fail("the whole array does not overlap every chunk", text);
  if (a.num_chunks == 0) return;
  std::vector<uint64_t> last(rank);
  for (size_t d = 0; d < rank; ++d) last[d] = a.grid[d] - 1;
  const ckptio::Box full = chunk_box(a, last), valid = chunk_valid_box(a, last);
  for (size_t d = 0; d < rank; ++d) {
    if (!(full.start[d] == valid.start[d] && valid.start[d] < valid.stop[d] && valid.stop[d] <= full.stop[d] &&
          valid.stop[d] == a.shape[d]))
      fail("the last chunk's boxes are wrong", text);
  }
  const std::string key = chunk_key(a, last);
  size_t seps = 0;
  for (char c : key) seps += c == a.separator;
  if (seps != (rank == 0 ? 0 : rank - 1) || key.empty()) fail("bad chunk key", key);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto a = ckptio::zarr::parse_zarray(text);
  if (!a.ok()) {
    const ckptio::Status& st = a.status();
    if (st.code() != ckptio::Code::kDataLoss && st.code() != ckptio::Code::kUnimplemented)
      fail("rejection is neither kDataLoss nor kUnimplemented", st.to_string());
    if (st.message().empty()) fail("rejection without a message", text);
    for (char c : st.message())
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control byte in message", st.message());
    return 0;
  }
  check_geometry(*a, text);
  const std::string once = ckptio::zarr::serialize_zarray(*a);
  auto back = ckptio::zarr::parse_zarray(once);
  if (!back.ok()) fail("serialized .zarray does not parse", back.status().to_string() + "\n" + once);
  if (!(*back == *a)) fail("parse(serialize(x)) != x", text + "\n---\n" + once);
  if (ckptio::zarr::serialize_zarray(*back) != once) fail("serialization is not stable", once);
  auto fill = ckptio::zarr::fill_value_bytes(*a);
  if (fill.ok()) {
    if (!fill->empty() && fill->size() != ckptio::dtype_size(a->dtype)) fail("fill value of the wrong size", text);
  } else if (fill.status().code() != ckptio::Code::kUnimplemented) {
    fail("fill_value_bytes failed", fill.status().to_string());
  }
  return 0;
}
