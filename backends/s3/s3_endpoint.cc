// The http(s) endpoints of S3, STS and instance metadata: checked and put in
// the one form that is signed (see normalize_endpoint).
#include <cctype>
#include <charconv>
#include <string>
#include <string_view>

#include "backends/s3/s3_config_internal.h"
#include "src/util/printable.h"

namespace ckptio::s3::config_internal {

// "HTTP://Host:9000/" -> "http://Host:9000"; `source` names where it came from.
Result<std::string> normalize_endpoint(std::string_view raw, const std::string& source) {
  if (raw.find('@') != std::string_view::npos)  // never echo: it may hold a password
    return invalid_argument("endpoint from " + source +
                            " contains user info ('@'); give credentials through "
                            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile");
  auto bad = [&](const std::string& why) {
    return invalid_argument("endpoint '" + printable(raw) + "' from " + source + ": " + why);
  };
  const std::string_view s = trim(raw);
  const size_t sep = s.find("://");
  if (sep == std::string_view::npos) return bad("expected http://host[:port] or https://host[:port]");
  const std::string scheme = lowercase(s.substr(0, sep));
  if (scheme != "http" && scheme != "https") return bad("scheme must be http or https");
  std::string_view rest = s.substr(sep + 3);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  for (char c : rest)
    if (is_space(c) || is_control_byte(static_cast<unsigned char>(c)))
      return bad("contains whitespace or control characters");
  if (rest.find_first_of("/?#") != std::string_view::npos)
    return bad("must not have a path, query or fragment");
  std::string_view host = rest, port;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated IPv6 literal");
    host = rest.substr(0, close + 1);
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("unexpected text after the IPv6 literal");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
    if (host.size() <= 2) return bad("empty host");
    for (char c : host.substr(1, host.size() - 2))
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.')
        return bad("invalid IPv6 literal");
  } else {
    const size_t colon = rest.rfind(':');
    if (colon != std::string_view::npos) {
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
    if (host.empty()) return bad("empty host");
    for (char c : host)
      if (!is_alnum(c) && c != '.' && c != '-' && c != '_') return bad("invalid host name");
  }
  if (!port.empty()) {
    unsigned v = 0;
    const auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
    if (!all_digits(port) || ec != std::errc() || ptr != port.data() + port.size() || v == 0 ||
        v > 65535)
      return bad("port must be 1-65535");
  }
  // curl leaves a scheme's default port out of the Host header; drop it here
  // too, so that a Host derived from the endpoint is the Host that gets signed.
  if ((scheme == "http" && port == "80") || (scheme == "https" && port == "443"))
    return scheme + "://" + std::string(host);
  return scheme + "://" + std::string(rest);
}

}  // namespace ckptio::s3::config_internal
