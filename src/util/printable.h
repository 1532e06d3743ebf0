#pragma once
// Outside text (a server's answer, a file's name or contents, an environment
// variable) quoted in an error message: control bytes as \xNN so that the
// message stays one line, and at most `max` characters of it (then "...") so
// that a hostile or broken peer cannot make a log line of megabytes.
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace ckptio {

inline bool is_control_byte(unsigned char c) { return c < 0x20 || c == 0x7f; }

// Text that goes into an HTTP header (a credential, a token) must have none.
inline bool has_control_byte(std::string_view s) {
  for (char c : s)
    if (is_control_byte(static_cast<unsigned char>(c))) return true;
  return false;
}

inline std::string printable(std::string_view s, size_t max = 256) {
  std::string out;
  size_t i = 0;
  for (; i < s.size(); ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    const size_t width = is_control_byte(u) ? 4 : 1;
    if (out.size() + width > max) break;
    if (width == 1) {
      out.push_back(s[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    }
  }
  if (i < s.size()) out += "...";
  return out;
}

// printable(), then every byte >= 0x80 as \xNN too: for text that may not be
// valid UTF-8 (a JSON parser's message quoting the bytes it choked on).
inline std::string ascii_printable(std::string_view s, size_t max = 200) {
  std::string out;
  for (char ch : printable(s, max)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out.push_back(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace ckptio
