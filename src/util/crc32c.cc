#include "src/util/crc32c.h"

#include <isa-l/crc.h>

#include <array>

namespace ckptio {

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  // crc32_iscsi works on the un-inverted register; the standard CRC-32C
  // inverts on entry and exit, which makes the function composable.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t r = ~crc;
  while (size > 0) {  // crc32_iscsi takes an int length
    int n = size > (1u << 30) ? (1 << 30) : static_cast<int>(size);
    r = crc32_iscsi(p, n, r);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return ~r;
}

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

// a * b modulo the polynomial, in the reflected representation (x^0 is the
// top bit).
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(2^k) modulo the polynomial, k = 0..31.
const std::array<uint32_t, 32>& x2n_table() {
  static const std::array<uint32_t, 32> table = [] {
    std::array<uint32_t, 32> t{};
    uint32_t p = 1u << 30;  // x^1
    t[0] = p;
    for (int n = 1; n < 32; ++n) t[n] = p = multmodp(p, p);
    return t;
  }();
  return table;
}

// x^(n * 2^k) modulo the polynomial.
uint32_t x2nmodp(uint64_t n, unsigned k) {
  const auto& table = x2n_table();
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = multmodp(table[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;  // shift a by 8 * len_b bits
}

}  // namespace ckptio
