// One chunk through libzstd, libblosc or zlib (contract in chunk_codec.h).
// Each refusal happens before the decoder writes past `dst` or allocates by
// what the input claims: zstd decodes in one pass straight into `dst` (no
// window buffer; a frame that needs more room fails with dstSize_tooSmall),
// blosc decodes only after its header's sizes are checked, zlib inflates
// into `dst` with avail_out bounded by it.
#include "src/layout/zarr/chunk_codec.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include <blosc.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

namespace ckptio::zarr {
namespace {

Status bad(const char* codec, const std::string& what) { return data_loss(std::string(codec) + " chunk: " + what); }

std::string n_bytes(uint64_t n) { return std::to_string(n) + " bytes"; }

// ---- zstd -------------------------------------------------------------------

// Walks the frames (zstd allows several, and skippable ones) and adds up the
// sizes they declare, so that frames claiming another size than `want` are
// refused before anything is decoded (frames without a declared size are
// bounded by the decode itself).
Status zstd_check_sizes(std::span<const std::byte> src, uint64_t want) {
  const char* p = reinterpret_cast<const char*>(src.data());
  size_t left = src.size();
  uint64_t total = 0;
  bool known = true;
  if (left == 0) return bad("zstd", "empty (no frame)");
  while (left > 0) {
    const unsigned long long fcs = ZSTD_getFrameContentSize(p, left);
    const size_t at = src.size() - left;
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
      return bad("zstd", "no valid frame header at byte " + std::to_string(at));
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN) {
      known = false;
    } else if (__builtin_add_overflow(total, static_cast<uint64_t>(fcs), &total) || total > want) {
      return bad("zstd", "its frames declare more than the " + n_bytes(want) + " expected");
    }
    const size_t frame = ZSTD_findFrameCompressedSize(p, left);
    if (ZSTD_isError(frame))
      return bad("zstd", "frame at byte " + std::to_string(at) + " is truncated or damaged (" +
                             ZSTD_getErrorName(frame) + ")");
    p += frame;
    left -= frame;
  }
  if (known && total != want)
    return bad("zstd", "its frames declare " + n_bytes(total) + ", expected " + n_bytes(want));
  return Status::OK();
}

// ---- zlib / gzip --------------------------------------------------------------

Status inflate_into(z_stream* z, bool gzip, std::span<const std::byte> src, std::span<std::byte> dst) {
  const char* codec = gzip ? "gzip" : "zlib";
  if (inflateReset2(z, gzip ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK) return bad(codec, "cannot reset the inflater");
  const Bytef* in = reinterpret_cast<const Bytef*>(src.data());
  Bytef* out = reinterpret_cast<Bytef*>(dst.data());
  size_t in_left = src.size(), out_left = dst.size();
  // avail_in and avail_out are 32-bit: feed both in slices.
  constexpr size_t kSlice = size_t{1} << 30;
  for (;;) {
    const uInt give_in = static_cast<uInt>(std::min(in_left, kSlice));
    const uInt give_out = static_cast<uInt>(std::min(out_left, kSlice));
    z->next_in = const_cast<Bytef*>(in);
    z->avail_in = give_in;
    z->next_out = out;
    z->avail_out = give_out;
    const int r = inflate(z, Z_NO_FLUSH);
    const size_t used_in = give_in - z->avail_in, made = give_out - z->avail_out;
    in += used_in;
    in_left -= used_in;
    out += made;
    out_left -= made;
    if (r == Z_STREAM_END) {
      const size_t got = dst.size() - out_left;
      if (got != dst.size()) return bad(codec, "decodes to " + n_bytes(got) + ", expected " + n_bytes(dst.size()));
      if (in_left != 0) return bad(codec, n_bytes(in_left) + " after the end of the stream");
      return Status::OK();
    }
    if (r == Z_OK) continue;
    if (r == Z_BUF_ERROR) {
      // No progress possible: either the output is full (the stream holds
      // more than expected) or the input ended before the stream did.
      if (in_left == 0) return bad(codec, "truncated: the input ends inside the stream, after " +
                                              n_bytes(dst.size() - out_left) + " of output");
      if (out_left == 0) return bad(codec, "decodes to more than the " + n_bytes(dst.size()) + " expected");
      return bad(codec, "damaged stream (no progress)");
    }
    return bad(codec, std::string("damaged stream (") + (z->msg ? z->msg : "inflate error " + std::to_string(r)) + ")");
  }
}

const char* codec_name(CodecId id) {
  switch (id) {
    case CodecId::kNone: return "uncompressed";
    case CodecId::kZstd: return "zstd";
    case CodecId::kBlosc: return "blosc";
    case CodecId::kZlib: return "zlib";
    case CodecId::kGzip: return "gzip";
  }
  return "zarr";
}

}  // namespace

// ---- ChunkDecoder -------------------------------------------------------------

struct ChunkDecoder::Contexts {
  ZSTD_DCtx* zstd = nullptr;
  z_stream zlib{};
  bool zlib_ready = false;
  ~Contexts() {
    ZSTD_freeDCtx(zstd);
    if (zlib_ready) inflateEnd(&zlib);
  }
};

ChunkDecoder::ChunkDecoder() : ctx_(std::make_unique<Contexts>()) {}
ChunkDecoder::~ChunkDecoder() = default;

Status check_stored_size(const Compressor& c, uint64_t stored, uint64_t decoded) {
  const char* codec = codec_name(c.id);
  if (c.id == CodecId::kNone) {
    if (stored != decoded) return bad(codec, "holds " + n_bytes(stored) + ", expected " + n_bytes(decoded));
    return Status::OK();
  }
  // The worst expansion of any codec here: zstd's ZSTD_compressBound (n/256
  // + 64 bytes for small inputs), blosc's 16-byte header over memcpy'd
  // blocks, deflate's stored blocks (5 bytes per 64 KiB) and gzip's header
  // and trailer; n/128 and 64 KiB cover all of them.
  const uint64_t most = decoded + decoded / 128 + (64u << 10);
  if (stored > most)
    return bad(codec, n_bytes(stored) + " stored, more than any encoding of the " + n_bytes(decoded) + " expected");
  // The best ratio: a zstd block of at most 128 KiB takes 4 bytes or more
  // (an RLE block; deflate's best is 1032:1, blosc's inner codecs no better).
  if (stored < decoded / 32768)
    return bad(codec, n_bytes(stored) + " stored cannot decode into the " + n_bytes(decoded) + " expected");
  return Status::OK();
}

Status check_chunk(const Compressor& c, std::span<const std::byte> src, uint64_t decoded) {
  CKPTIO_RETURN_IF_ERROR(check_stored_size(c, src.size(), decoded));
  if (c.id == CodecId::kZstd) return zstd_check_sizes(src, decoded);
  if (c.id != CodecId::kBlosc) return Status::OK();
  if (src.size() < BLOSC_MIN_HEADER_LENGTH) return bad("blosc", n_bytes(src.size()) + ", shorter than a blosc header");
  size_t nbytes = 0, cbytes = 0, blocksize = 0;
  blosc_cbuffer_sizes(src.data(), &nbytes, &cbytes, &blocksize);
  if (cbytes != src.size())
    return bad("blosc", "its header says " + n_bytes(cbytes) + " compressed, the chunk holds " + n_bytes(src.size()));
  if (nbytes != decoded)
    return bad("blosc", "its header declares " + n_bytes(nbytes) + ", expected " + n_bytes(decoded));
  size_t valid_nbytes = 0;
  if (blosc_cbuffer_validate(src.data(), src.size(), &valid_nbytes) != 0 || valid_nbytes != decoded)
    return bad("blosc", "invalid header");
  return Status::OK();
}

Status ChunkDecoder::decode(const Compressor& c, std::span<const std::byte> src, std::span<std::byte> dst) {
  CKPTIO_RETURN_IF_ERROR(check_chunk(c, src, dst.size()));
  switch (c.id) {
    case CodecId::kNone:
      if (!dst.empty()) std::memcpy(dst.data(), src.data(), dst.size());
      return Status::OK();

    case CodecId::kZstd: {
      if (!ctx_->zstd && !(ctx_->zstd = ZSTD_createDCtx()))
        return Status(Code::kInternal, "zstd: cannot create a context");
      const size_t r = ZSTD_decompressDCtx(ctx_->zstd, dst.data(), dst.size(), src.data(), src.size());
      if (ZSTD_isError(r)) {
        if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
          return bad("zstd", "decodes to more than the " + n_bytes(dst.size()) + " expected");
        return bad("zstd", std::string("damaged (") + ZSTD_getErrorName(r) + ")");
      }
      if (r != dst.size()) return bad("zstd", "decodes to " + n_bytes(r) + ", expected " + n_bytes(dst.size()));
      return Status::OK();
    }

    case CodecId::kBlosc: {
      if (dst.empty()) return Status::OK();
      const int r = blosc_decompress_ctx(src.data(), dst.data(), dst.size(), 1);
      if (r <= 0 || static_cast<size_t>(r) != dst.size())
        return bad("blosc", "damaged (blosc_decompress_ctx returned " + std::to_string(r) + ")");
      return Status::OK();
    }

    case CodecId::kZlib:
    case CodecId::kGzip: {
      if (!ctx_->zlib_ready) {
        ctx_->zlib = z_stream{};
        if (inflateInit2(&ctx_->zlib, MAX_WBITS) != Z_OK)
          return Status(Code::kInternal, "zlib: cannot create an inflater");
        ctx_->zlib_ready = true;
      }
      return inflate_into(&ctx_->zlib, c.id == CodecId::kGzip, src, dst);
    }
  }
  return Status(Code::kInternal, "zarr: unknown codec");
}

// ---- ChunkEncoder -------------------------------------------------------------

struct ChunkEncoder::Contexts {
  ZSTD_CCtx* zstd = nullptr;
  ~Contexts() { ZSTD_freeCCtx(zstd); }
};

ChunkEncoder::ChunkEncoder() : ctx_(std::make_unique<Contexts>()) {}
ChunkEncoder::~ChunkEncoder() = default;

Result<size_t> encoded_bound(const Compressor& c, size_t n) {
  if (c.id != CodecId::kZstd) return n;
  const size_t bound = ZSTD_compressBound(n);
  if (ZSTD_isError(bound)) return invalid_argument("zstd: " + n_bytes(n) + " is too large to compress");
  return bound;
}

Result<size_t> ChunkEncoder::encode_into(const Compressor& c, std::span<const std::byte> src, std::span<std::byte> dst) {
  CKPTIO_ASSIGN_OR_RETURN(const size_t bound, encoded_bound(c, src.size()));
  if (dst.size() < bound)
    return Status(Code::kInternal, "zarr: encode_into needs " + n_bytes(bound) + ", given " + n_bytes(dst.size()));
  switch (c.id) {
    case CodecId::kNone:
      if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size());
      return src.size();
    case CodecId::kZstd: {
      if (!ctx_->zstd && !(ctx_->zstd = ZSTD_createCCtx()))
        return Status(Code::kInternal, "zstd: cannot create a context");
      const size_t r = ZSTD_compressCCtx(ctx_->zstd, dst.data(), dst.size(), src.data(), src.size(), c.level);
      if (ZSTD_isError(r)) return Status(Code::kInternal, std::string("zstd: ") + ZSTD_getErrorName(r));
      return r;
    }
    default:
      return Status(Code::kUnimplemented, "zarr: encoding is zstd or none only");
  }
}

Status ChunkEncoder::encode(const Compressor& c, std::span<const std::byte> src, std::vector<std::byte>* out) {
  CKPTIO_ASSIGN_OR_RETURN(const size_t bound, encoded_bound(c, src.size()));
  out->resize(bound);
  auto r = encode_into(c, src, *out);
  if (!r.ok()) return r.status();
  out->resize(*r);
  return Status::OK();
}

Status decode_chunk(const Compressor& c, std::span<const std::byte> src, std::span<std::byte> dst) {
  ChunkDecoder d;
  return d.decode(c, src, dst);
}

Status encode_chunk(const Compressor& c, std::span<const std::byte> src, std::vector<std::byte>* out) {
  ChunkEncoder e;
  return e.encode(c, src, out);
}

}  // namespace ckptio::zarr
