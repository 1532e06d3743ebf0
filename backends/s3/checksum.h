// The checksum an upload carries so that the server refuses a body damaged on
// the way (x-amz-checksum-crc32c, as the AWS SDKs send by default): the
// CRC-32C of the body, ISA-L's (src/util/crc32c.h, many GB/s), as S3 wants
// it: base64 of its 4 bytes, big-endian. Computed once per body, not per
// attempt: a retry resends the same bytes from memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ckptio::s3 {

inline constexpr const char* kChecksumHeader = "x-amz-checksum-crc32c";

// "4waSgw==" for crc32c("123456789") = 0xE3069283.
std::string crc32c_base64(uint32_t crc);
std::string crc32c_base64(std::span<const std::byte> body);

}  // namespace ckptio::s3
