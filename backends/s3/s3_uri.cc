// parse_s3_uri: s3://bucket[/prefix], checked as s3_config.h states.
#include <string>
#include <string_view>

#include "backends/s3/s3_config.h"
#include "backends/s3/s3_config_internal.h"
#include "src/util/printable.h"

namespace ckptio::s3 {
namespace {

using config_internal::is_alnum;

Status bad_uri(std::string_view uri, const std::string& why) {
  return invalid_argument("invalid S3 URI '" + printable(uri) + "': " + why);
}

Status check_bucket(std::string_view uri, std::string_view b) {
  if (b.empty()) return bad_uri(uri, "empty bucket name (expected s3://bucket[/prefix])");
  if (b.size() < 3 || b.size() > 63) return bad_uri(uri, "bucket names have 3 to 63 characters");
  for (char c : b)
    if (!is_alnum(c) && c != '.' && c != '-' && c != '_')
      return bad_uri(uri, "bucket names contain only letters, digits, '.', '-' and '_'");
  if (!is_alnum(b.front()) || !is_alnum(b.back()))
    return bad_uri(uri, "bucket names start and end with a letter or digit");
  if (b.find("..") != std::string_view::npos) return bad_uri(uri, "bucket name contains '..'");
  return Status::OK();
}

Status check_prefix(std::string_view uri, std::string_view p) {
  for (char c : p) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') return bad_uri(uri, "prefix contains a backslash");
    if (c == '\0') return bad_uri(uri, "prefix contains NUL");
    if (is_control_byte(u)) return bad_uri(uri, "prefix contains a control character");
  }
  size_t start = 0;
  while (true) {
    const size_t end = p.find('/', start);
    const std::string_view seg = p.substr(start, end == std::string_view::npos ? end : end - start);
    if (seg.empty()) return bad_uri(uri, "prefix has an empty path segment ('//')");
    if (seg == "." || seg == "..") return bad_uri(uri, "prefix has a '.' or '..' segment");
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return Status::OK();
}

}  // namespace

Result<S3Uri> parse_s3_uri(std::string_view uri) {
  constexpr std::string_view kScheme = "s3://";
  if (uri.substr(0, kScheme.size()) != kScheme) return bad_uri(uri, "expected s3://bucket[/prefix]");
  const std::string_view rest = uri.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  CKPTIO_RETURN_IF_ERROR(check_bucket(uri, bucket));
  S3Uri out{std::string(bucket), ""};
  if (slash == std::string_view::npos) return out;
  std::string_view prefix = rest.substr(slash + 1);
  if (!prefix.empty() && prefix.back() == '/') {
    prefix.remove_suffix(1);
    if (prefix.empty()) return bad_uri(uri, "prefix has an empty path segment ('//')");
  }
  if (prefix.empty()) return out;
  CKPTIO_RETURN_IF_ERROR(check_prefix(uri, prefix));
  out.prefix = std::string(prefix);
  return out;
}

}  // namespace ckptio::s3
