// CRC-32C (Castagnoli), the checksum of every shard: ISA-L's crc32_iscsi,
// which uses the CPU's crc32 / pclmul instructions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptio {

// Streaming form: crc32c(b, crc32c(a)) == crc32c(a ++ b). Start from 0.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// crc32c(a ++ b) from crc_a = crc32c(a), crc_b = crc32c(b) and the length of
// b, without the bytes (zlib's crc32_combine for the Castagnoli polynomial):
// lets several threads checksum pieces of one shard and the pieces be joined
// in order afterwards. O(log len_b).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace ckptio
