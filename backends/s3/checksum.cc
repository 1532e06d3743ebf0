#include "backends/s3/checksum.h"

#include <openssl/evp.h>

#include "src/util/crc32c.h"

namespace ckptio::s3 {

std::string crc32c_base64(uint32_t crc) {
  const unsigned char be[4] = {static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
                               static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
  unsigned char out[9] = {};  // 8 characters and EVP_EncodeBlock's NUL
  const int n = EVP_EncodeBlock(out, be, 4);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string crc32c_base64(std::span<const std::byte> body) {
  return crc32c_base64(ckptio::crc32c(body.data(), body.size()));
}

}  // namespace ckptio::s3
