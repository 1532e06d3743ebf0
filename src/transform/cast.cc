#include "src/transform/cast.h"

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

#ifdef __FLT16_MAX__  // the compiler has _Float16 (GCC 12, clang >= 15 on x86-64)
uint16_t float_to_f16(float f) { _Float16 h = static_cast<_Float16>(f); uint16_t u; std::memcpy(&u, &h, 2); return u; }
float f16_to_float(uint16_t u) { _Float16 h; std::memcpy(&h, &u, 2); return static_cast<float>(h); }
#else  // clang 14 (the fuzz build): the same conversions in integer arithmetic
uint16_t float_to_f16(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t exp = (x >> 23) & 0xff;
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (e < -10) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  uint32_t h, rem, half;
  if (e <= 0) {  // subnormal result
    mant |= 0x800000;
    const int shift = 14 - e;
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {
    h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
    rem = mant & 0x1fff;
    half = 0x1000;
  }
  if (rem > half || (rem == half && (h & 1))) ++h;  // a carry rounds up to the next binade or inf
  return static_cast<uint16_t>(sign | h);
}
float f16_to_float(uint16_t u) {
  const uint32_t sign = static_cast<uint32_t>(u & 0x8000) << 16;
  const uint32_t exp = (u >> 10) & 0x1f;
  const uint32_t mant = u & 0x3ff;
  if (exp == 0) {
    const float m = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -m : m;
  }
  if (exp == 31) return float_of(sign | 0x7f800000 | (mant ? 0x400000 | (mant << 13) : 0));
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}
#endif

double load(DType t, const unsigned char* p) {
  switch (t) {
    case DType::kFloat16: { uint16_t u; std::memcpy(&u, p, 2); return f16_to_float(u); }
    case DType::kBFloat16: { uint16_t u; std::memcpy(&u, p, 2); return bf16_to_float(u); }
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    default: { double d; std::memcpy(&d, p, 8); return d; }
  }
}

// A double narrowed to float rounding to odd: toward zero, with the last bit
// set when anything was dropped. Rounding that float to a narrower type (11
// or 8 significant bits against float's 24) to nearest even then equals
// rounding the double directly; rounding to nearest twice could not tell a
// value just above a tie from the tie (1 + 2^-8 + 2^-40 to bfloat16).
float to_float_odd(double v) {
  float f = static_cast<float>(v);
  if (std::isnan(v) || static_cast<double>(f) == v) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  return float_of(bits_of(f) | 1);
}

void store(DType t, double v, unsigned char* p) {
  switch (t) {
    case DType::kFloat16: { uint16_t u = float_to_f16(to_float_odd(v)); std::memcpy(p, &u, 2); break; }
    case DType::kBFloat16: { uint16_t u = float_to_bf16(to_float_odd(v)); std::memcpy(p, &u, 2); break; }
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
