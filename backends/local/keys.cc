#include "backends/local/keys.h"

#include <sys/random.h>

#include <random>

#include "ckptio/storage.h"

namespace ckptio::local {

namespace {

// The seam's rules (check_storage_key / check_storage_prefix), plus one of
// this backend's own: no component may look like its temporary files (the
// last part of a prefix may: it is only the start of a name).
Status check_path(std::string_view s, bool is_prefix) {
  CKPTIO_RETURN_IF_ERROR(is_prefix ? check_storage_prefix(s) : check_storage_key(s));
  size_t start = 0;
  while (start < s.size()) {
    const size_t end = s.find('/', start);
    const bool last = end == std::string_view::npos;
    if ((!is_prefix || !last) && is_temp_name(s.substr(start, last ? std::string_view::npos : end - start)))
      return invalid_argument(std::string(is_prefix ? "prefix '" : "key '") + std::string(s) +
                              "': uses the backend's temporary-file name pattern");
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
