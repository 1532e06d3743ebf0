#pragma once
// Outside text (a server's answer, a file's name or contents, an environment
// variable) quoted in an error message or shown on a terminal: control bytes
// as \xNN so that the message stays one line and cannot drive the terminal,
// and at most `max` bytes of it (then "...") so that a hostile or broken
// peer cannot make a log line of megabytes. The one place for this: the
// index reader's messages and the CLI's terminal text use it too.
#include <cstddef>
#include <cstdint>
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

// How printable() treats the text. One function for every place outside
// text is shown (errors, logs, the CLI's tables and terminal lines).
struct Printable {
  // Bytes of output kept before "..." (SIZE_MAX: all). The cut never splits
  // a UTF-8 sequence or an escape.
  size_t max = 256;
  // Every byte >= 0x80 as \xNN too: for text that may not be valid UTF-8
  // (a JSON parser's message quoting the bytes it choked on).
  bool ascii = false;
  // Newline and tab kept: multi-line text meant for a terminal.
  bool keep_lines = false;
};

// Control bytes as \xNN, and the UTF-8 C1 controls (U+0080..U+009F, which
// terminals obey as escapes) as \xC2\xNN.
inline std::string printable(std::string_view s, const Printable& how) {
  std::string out;
  out.reserve(s.size() < how.max ? s.size() : how.max);
  auto escape = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  };
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool c1 = c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(s[i + 1]) <= 0x9F;
    const bool control = (is_control_byte(c) && !(how.keep_lines && (c == '\n' || c == '\t'))) || c1;
    // One unit: a byte, or a whole UTF-8 sequence kept as it is.
    size_t n = 1;
    if (!control && !how.ascii && c >= 0xC0)
      while (i + n < s.size() && n < 4 && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    if (c1) n = 2;
    const size_t width = (control || (how.ascii && c >= 0x80)) ? 4 * n : n;
    if (out.size() + width > how.max) break;
    if (width == n) {
      out.append(s.substr(i, n));
    } else {
      for (size_t k = 0; k < n; ++k) escape(static_cast<unsigned char>(s[i + k]));
    }
    i += n;
  }
  if (i < s.size()) out += "...";
  return out;
}

inline std::string printable(std::string_view s, size_t max = 256) { return printable(s, Printable{max}); }

inline std::string ascii_printable(std::string_view s, size_t max = 200) {
  return printable(s, Printable{max, /*ascii=*/true});
}

}  // namespace ckptio
