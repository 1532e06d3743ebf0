// x-amz-checksum-crc32c's value: base64 of the body's CRC-32C, big-endian
// (AWS's "Checking object integrity"), against published vectors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/s3/checksum.h"

namespace ckptio::s3 {
namespace {

std::string of(const std::string& s) { return crc32c_base64(std::as_bytes(std::span(s.data(), s.size()))); }

TEST(S3Checksum, HeaderIsBase64OfTheBigEndianCrc32c) {
  EXPECT_EQ(of(""), "AAAAAA==");
  EXPECT_EQ(of("123456789"), "4waSgw==");  // the CRC-32C check value, 0xE3069283
  EXPECT_EQ(of("Hello world"), "crUfeA==");  // the AWS SDKs' test vector
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, 0x8A9136AA; of 0xFF, 0x62A8AB43.
  EXPECT_EQ(of(std::string(32, '\0')), "ipE2qg==");
  EXPECT_EQ(of(std::string(32, '\xff')), "YqirQw==");
  EXPECT_EQ(crc32c_base64(0xE3069283u), "4waSgw==");
  EXPECT_EQ(crc32c_base64(0u), "AAAAAA==");
  EXPECT_EQ(crc32c_base64(0xFFFFFFFFu), "/////w==");
}

TEST(S3Checksum, EveryByteCounts) {
  std::string body(1 << 20, 'x');
  const std::string whole = of(body);
  body[body.size() / 2] ^= 1;
  EXPECT_NE(of(body), whole);
}

}  // namespace
}  // namespace ckptio::s3
