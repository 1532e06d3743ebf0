#include "backends/local/keys.h"

#include <sys/random.h>

#include <random>

namespace ckptio::local {

namespace {

Status check_path(std::string_view s, bool is_prefix) {
  const std::string what = is_prefix ? "prefix" : "key";
  auto bad = [&](const char* why) {
    std::string printable;
    for (char c : s) printable += (c == '\0') ? std::string("\\0") : std::string(1, c);
    return invalid_argument(what + " '" + printable + "': " + why);
  };
  if (s.empty()) return is_prefix ? Status::OK() : bad("empty");
  if (s.front() == '/') return bad("must be relative (leading '/')");
  if (s.find('\0') != std::string_view::npos) return bad("contains NUL");
  if (s.find('\\') != std::string_view::npos) return bad("contains a backslash");
  if (s.find("..") != std::string_view::npos) return bad("contains '..'");
  if (!is_prefix && s.back() == '/') return bad("ends with '/'");
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('/', start);
    const bool last = end == std::string_view::npos;
    std::string_view part = s.substr(start, last ? std::string_view::npos : end - start);
    if (part.empty()) return bad("has an empty path component");
    if (part == ".") return bad("has a '.' path component");
    if (!is_prefix || !last) {
      if (is_temp_name(part)) return bad("uses the backend's temporary-file name pattern");
    }
    if (last) break;
    start = end + 1;
  }
  return Status::OK();
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

}  // namespace

Status check_key(std::string_view key) { return check_path(key, false); }
Status check_prefix(std::string_view prefix) { return check_path(prefix, true); }

std::pair<std::string_view, std::string_view> split_prefix(std::string_view prefix) {
  size_t slash = prefix.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view(), prefix};
  return {prefix.substr(0, slash + 1), prefix.substr(slash + 1)};
}

std::string temp_path_for(const std::string& path) {
  // From the kernel at every call, as attempt ids (src/layout/layout.cc): a
  // generator kept in memory would repeat its names in forked children.
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
    std::random_device rd;
    v = static_cast<uint64_t>(rd()) << 32 ^ rd();
  }
  static const char* hex = "0123456789abcdef";
  std::string suffix(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) suffix[i] = hex[v & 15];
  return path + std::string(kTempMarker) + suffix;
}

bool is_temp_name(std::string_view name) {
  const size_t n = kTempMarker.size() + 16;
  if (name.size() <= n) return false;
  std::string_view tail = name.substr(name.size() - n);
  if (tail.substr(0, kTempMarker.size()) != kTempMarker) return false;
  for (char c : tail.substr(kTempMarker.size()))
    if (!is_hex(c)) return false;
  return true;
}

}  // namespace ckptio::local
