// The transform stage of the read path: each piece of a leaf the read
// executor delivers passes through one on its way from the bytes as saved
// to the bytes the destination holds. Today: identity (a memcpy) or a dtype
// cast (src/transform/cast.h), applied per piece while later reads are in
// flight, so a cast restore allocates each leaf once, in the dtype asked
// for. Decompressing the chunks of a zarr array is the next transform; it
// will change lengths per chunk rather than per element, and come with its
// own offset map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ckptio/status.h"
#include "ckptio/types.h"
#include "src/transform/cast.h"

namespace ckptio {

class PieceTransform {
 public:
  PieceTransform() = default;  // identity
  // A cast from `from` to `to` (identity when they are the same).
  PieceTransform(DType from, DType to)
      : from_(from), to_(to), in_(dtype_size(from)), out_(dtype_size(to)), cast_(from != to) {}

  bool identity() const { return !cast_; }
  // Where saved byte `offset` (a multiple of the element size) goes in the
  // destination, counted in the destination's bytes.
  uint64_t out_offset(uint64_t offset) const { return cast_ ? offset / in_ * out_ : offset; }
  // `n` saved bytes (whole elements) at src into dst.
  Status apply(const std::byte* src, std::byte* dst, uint64_t n) const {
    if (!cast_) {
      std::memcpy(dst, src, n);
      return Status::OK();
    }
    return cast_elements(from_, to_, src, dst, n / in_);
  }

 private:
  DType from_ = DType::kUInt8, to_ = DType::kUInt8;
  size_t in_ = 1, out_ = 1;
  bool cast_ = false;
};

}  // namespace ckptio
