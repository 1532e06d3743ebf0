#include "src/crc32c.h"

#include <isa-l/crc.h>

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

}  // namespace ckptio
