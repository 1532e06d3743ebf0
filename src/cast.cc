#include "src/cast.h"

#include <cmath>
#include <cstring>

namespace ckptio {
namespace {

uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
float bf16_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_f16(float f) { _Float16 h = static_cast<_Float16>(f); uint16_t u; std::memcpy(&u, &h, 2); return u; }
float f16_to_float(uint16_t u) { _Float16 h; std::memcpy(&h, &u, 2); return static_cast<float>(h); }

double load(DType t, const unsigned char* p) {
  switch (t) {
    case DType::kFloat16: { uint16_t u; std::memcpy(&u, p, 2); return f16_to_float(u); }
    case DType::kBFloat16: { uint16_t u; std::memcpy(&u, p, 2); return bf16_to_float(u); }
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    default: { double d; std::memcpy(&d, p, 8); return d; }
  }
}

void store(DType t, double v, unsigned char* p) {
  switch (t) {
    case DType::kFloat16: { uint16_t u = float_to_f16(static_cast<float>(v)); std::memcpy(p, &u, 2); break; }
    case DType::kBFloat16: { uint16_t u = float_to_bf16(static_cast<float>(v)); std::memcpy(p, &u, 2); break; }
    case DType::kFloat32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    default: std::memcpy(p, &v, 8); break;
  }
}

}  // namespace

bool can_cast(DType from, DType to) { return dtype_is_float(from) && dtype_is_float(to); }

Status cast_elements(DType from, DType to, const void* src, void* dst, uint64_t count) {
  if (!can_cast(from, to))
    return invalid_argument("cannot cast " + std::string(dtype_name(from)) + " to " +
                            std::string(dtype_name(to)) + " (only between float kinds)");
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const size_t fs = dtype_size(from), ts = dtype_size(to);
  if (from == to) { std::memcpy(d, s, count * fs); return Status::OK(); }
  // Fast path for the common float32 -> bfloat16 save cast.
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    for (uint64_t i = 0; i < count; ++i) {
      float f; std::memcpy(&f, s + 4 * i, 4);
      uint16_t h = float_to_bf16(f);
      std::memcpy(d + 2 * i, &h, 2);
    }
    return Status::OK();
  }
  for (uint64_t i = 0; i < count; ++i) store(to, load(from, s + i * fs), d + i * ts);
  return Status::OK();
}

}  // namespace ckptio
