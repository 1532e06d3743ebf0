// CRC-32C (Castagnoli), the checksum of every shard: ISA-L's crc32_iscsi,
// which uses the CPU's crc32 / pclmul instructions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptio {

// Streaming form: crc32c(b, crc32c(a)) == crc32c(a ++ b). Start from 0.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace ckptio
