// Fuzzes the chunk decoder (src/layout/zarr/chunk_codec.h) with a bounded
// expected size. Input: byte 0 selects the codec (an ASCII digit its value,
// any other byte its value, modulo 5: 0 none, 1 zstd, 2 blosc, 3 zlib,
// 4 gzip), bytes 1..2 the expected decoded size (little-endian, so at most
// 65,535), the rest is the stored chunk.
//
// Properties:
//   - no crash, hang, leak or sanitizer report, whatever sizes the chunk's
//     headers claim (a frame declaring a terabyte must be refused by its
//     header: the sanitizer's allocation limit would catch an attempt);
//   - a rejection is kDataLoss with a message free of control bytes;
//   - decoding is exact: a chunk accepted at size n is refused at n + 1 and,
//     if n > 0, at n - 1;
//   - it is deterministic: a second decoder (fresh contexts) and the first
//     one again give the same bytes;
//   - zstd round trip: the decoded bytes, encoded again at level 1, decode
//     to the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "src/layout/zarr/chunk_codec.h"

namespace {

using namespace ckptio::zarr;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "chunk_decode_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_rejection(const ckptio::Status& st) {
  if (st.code() != ckptio::Code::kDataLoss) fail("rejection is not kDataLoss", st.to_string());
  if (st.message().empty()) fail("rejection without a message", "");
  for (char c : st.message())
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control byte in message", st.message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  static ChunkDecoder reused;  // contexts carried from input to input, as a worker's are
  const int which = (data[0] >= '0' && data[0] <= '9' ? data[0] - '0' : data[0]) % 5;
  const CodecId ids[] = {CodecId::kNone, CodecId::kZstd, CodecId::kBlosc, CodecId::kZlib, CodecId::kGzip};
  Compressor c;
  c.id = ids[which];
  const size_t want = data[1] | (size_t{data[2]} << 8);
  const std::span<const std::byte> src(reinterpret_cast<const std::byte*>(data) + 3, size - 3);

  std::vector<std::byte> out(want);
  const ckptio::Status s = reused.decode(c, src, out);
  if (!s.ok()) {
    check_rejection(s);
    return 0;
  }
  std::vector<std::byte> again(want, std::byte{0xA5});
  ChunkDecoder fresh;
  if (!fresh.decode(c, src, again).ok() || again != out) fail("a fresh decoder differs", s.to_string());
  std::vector<std::byte> larger(want + 1);
  if (reused.decode(c, src, larger).ok()) fail("accepted at size n and n + 1", std::to_string(want));
  if (want > 0) {
    std::vector<std::byte> smaller(want - 1);
    if (reused.decode(c, src, smaller).ok()) fail("accepted at size n and n - 1", std::to_string(want));
  }
  if (c.id == CodecId::kZstd) {
    std::vector<std::byte> enc, back(want);
    if (!encode_chunk(Compressor{CodecId::kZstd, 1}, out, &enc).ok()) fail("zstd encode failed", "");
    if (!reused.decode(c, enc, back).ok() || back != out) fail("zstd round trip differs", "");
  }
  return 0;
}
