// Byte scans of JSON text that only need to know what lies inside strings:
// screening nesting before a parser sees the text (src/index/strict_reader.cc,
// src/sharding/json.cc) and finding where a container ends (the index's
// fast reader). They do not validate JSON; they agree with any JSON lexer
// on what is inside a string for the prefix the lexer accepts: a quote
// outside a string always opens one, and a backslash inside one always
// escapes the next byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ckptio {

// Calls on_bracket(opening) for each [ { (true) and ] } (false) outside
// strings from text[from] on; returns the offset of the first for which it
// returns true, or npos.
template <class OnBracket>
size_t scan_brackets(std::string_view text, size_t from, OnBracket&& on_bracket) {
  bool in_string = false;
  for (size_t i = from; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '[' || c == '{' || c == ']' || c == '}') && on_bracket(c == '[' || c == '{')) {
      return i;
    }
  }
  return std::string_view::npos;
}

// The offset at which nesting first exceeds `max_depth`, or npos.
inline size_t find_excess_depth(std::string_view text, uint64_t max_depth) {
  uint64_t depth = 0;
  return scan_brackets(text, 0, [&](bool opening) {
    if (opening) return ++depth > max_depth;
    if (depth > 0) --depth;
    return false;
  });
}

// One past the ] or } that closes the container opening at text[at], or npos.
inline size_t end_of_container(std::string_view text, size_t at) {
  uint64_t depth = 0;
  const size_t close = scan_brackets(text, at, [&](bool opening) { return opening ? (++depth, false) : --depth == 0; });
  return close == std::string_view::npos ? close : close + 1;
}

}  // namespace ckptio
