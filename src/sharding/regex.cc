// The Python-versus-RE2 screen for partition-rule regexes (see the header).
// It walks the pattern the way both parsers tokenize it: an escape consumes
// the next byte, and a character class runs to its first unescaped ']' (a ']'
// right after '[' or '[^' is literal in both).
#include "src/sharding/regex.h"

#include <re2/re2.h>

#include <string>

namespace ckptio {
namespace {

Status unsupported(std::string_view pattern, size_t at, const std::string& what) {
  return invalid_argument("regex \"" + std::string(pattern) + "\" at offset " + std::to_string(at) + ": " + what);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// A group opening "(?..." at `i`: names the Python-only forms.
Status check_group(std::string_view p, size_t i) {
  const std::string_view rest = p.substr(i + 2);
  auto starts = [&](std::string_view s) { return rest.substr(0, s.size()) == s; };
  if (starts("=") || starts("!")) return unsupported(p, i, "lookahead (?= (?! is not supported by RE2");
  if (starts("<=") || starts("<!")) return unsupported(p, i, "lookbehind (?<= (?<! is not supported by RE2");
  if (starts("P=")) return unsupported(p, i, "the backreference (?P=name) is not supported by RE2");
  if (starts(">")) return unsupported(p, i, "the atomic group (?> is not supported by RE2");
  if (starts("(")) return unsupported(p, i, "the conditional (?(...) is not supported by RE2");
  if (starts("#")) return unsupported(p, i, "the comment (?#...) is not supported by RE2");
  // Inline flags: (?aiLmsux-imsx:...) or (?aiLmsux).
  size_t k = 0;
  while (k < rest.size() && (is_letter(rest[k]) || rest[k] == '-')) ++k;
  if (k > 0 && k < rest.size() && (rest[k] == ')' || rest[k] == ':')) {
    for (char f : rest.substr(0, k))
      if (f == 'x' || f == 'a' || f == 'u' || f == 'L')
        return unsupported(p, i, std::string("the inline flag '") + f + "' is not supported by RE2");
  }
  return Status::OK();
}

}  // namespace

Status check_python_regex(std::string_view p) {
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) break;  // RE2 reports the trailing backslash
      const char e = p[i + 1];
      if (e >= '1' && e <= '9')
        return unsupported(p, i, std::string("the backreference \\") + e + " is not supported by RE2");
      if (e == 'Z')
        return unsupported(p, i, "\\Z is not supported by RE2; write $ (the same in Python for a path that does "
                                 "not end in a newline), or \\z (end of text in RE2, but Python before 3.14 "
                                 "refuses it)");
      ++i;
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') ++j;
      if (j < p.size() && p[j] == ']') ++j;  // literal ']' first in the class
      for (; j < p.size() && p[j] != ']'; ++j) {
        if (p[j] == '\\') {
          ++j;
        } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':' &&
                   p.find(":]", j + 2) != std::string_view::npos) {
          return unsupported(p, j, "[:name:] inside a class is a POSIX class in RE2 but literal characters "
                                   "in Python; write the characters out");
        }
      }
      i = j;  // at the closing ']' (or the end: RE2 reports the open class)
    } else if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      if (Status s = check_group(p, i); !s.ok()) return s;
    } else if (c == '{' && i + 1 < p.size() && p[i + 1] == ',') {
      size_t j = i + 2;
      while (j < p.size() && is_digit(p[j])) ++j;
      if (j < p.size() && p[j] == '}')
        return unsupported(p, i, "Python reads {,n} as {0,n} (and {,} as *) but RE2 reads it as literal "
                                 "text; write {0,n}");
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<const re2::RE2>> compile_python_regex(const std::string& pattern, const std::string& what) {
  if (Status s = check_python_regex(pattern); !s.ok()) return s.annotate(what);
  RE2::Options opts;
  opts.set_log_errors(false);    // errors come back as values, not on stderr
  opts.set_never_capture(true);  // only "does it match" is asked
  auto re = std::make_unique<const RE2>(pattern, opts);
  if (!re->ok())
    return invalid_argument(what + ": regex \"" + pattern + "\" is not valid for RE2: " + re->error());
  return re;
}

}  // namespace ckptio
