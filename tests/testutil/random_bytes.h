// Deterministic pseudo-random test data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace ckptio::testutil {

inline std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(&v[i], &x, std::min<size_t>(8, n - i));
  }
  return v;
}

}  // namespace ckptio::testutil
