// Fuzzes the storage seam's key rules (check_storage_key and
// check_storage_prefix, include/ckptio/storage.h; src/storage/storage_keys.cc). Keys
// come from listings of outside stores (an S3 bucket anyone may write to, a
// directory) and from index files, and every backend trusts these two
// functions to keep them inside the store's root.
//
// Properties checked on every input (any violation aborts):
//   - no crash, hang or sanitizer report;
//   - each function agrees exactly with an independent model of the rules in
//     the header: a key is non-empty and relative (no leading '/'), has no
//     NUL, backslash or "..", no trailing '/', no empty or "." component; a
//     prefix is empty, or the same except that its last name (after its last
//     '/') may be partial: empty, "." or anything else;
//   - a rejection is kInvalidArgument with a non-empty message;
//   - composition: for an accepted key K, K + "/" and every leading part of K
//     are accepted prefixes; for an accepted prefix P, P + "x" is an accepted
//     key; an accepted prefix P that is empty or ends in '/' and an accepted
//     key K give an accepted key P + K (the input is split at its first byte
//     0xff for the pair).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ckptio/storage.h"

namespace {

using ckptio::Code;
using ckptio::Status;

[[noreturn]] void fail(const char* what, std::string_view s) {
  std::string printable;
  for (char c : s) {
    char buf[8];
    std::snprintf(buf, sizeof buf, (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? "\\x%02X" : "%c",
                  static_cast<unsigned char>(c));
    printable += buf;
  }
  std::fprintf(stderr, "storage_key_fuzz: %s: '%s'\n", what, printable.c_str());
  std::abort();
}

// The rules, written again from the header. A key's components must all be
// non-empty and not "."; a prefix ends in '/' (a directory) or in a partial
// name ("run-5" lists "run-5*"), so only the components before its last '/'
// are checked.
bool model(std::string_view s, bool is_prefix) {
  if (s.empty()) return is_prefix;
  if (s.front() == '/') return false;
  if (s.find('\0') != std::string_view::npos || s.find('\\') != std::string_view::npos) return false;
  if (s.find("..") != std::string_view::npos) return false;
  if (!is_prefix && s.back() == '/') return false;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find('/', start);
    if (end == std::string_view::npos && is_prefix) return true;  // the partial last name
    const std::string_view part = s.substr(start, end == std::string_view::npos ? end : end - start);
    if (part.empty() || part == ".") return false;
    if (end == std::string_view::npos) return true;
    start = end + 1;
  }
}

bool check(std::string_view s, bool is_prefix) {
  const Status st = is_prefix ? ckptio::check_storage_prefix(s) : ckptio::check_storage_key(s);
  const bool want = model(s, is_prefix);
  if (st.ok() != want) fail(is_prefix ? "check_storage_prefix disagrees with the rules" :
                                        "check_storage_key disagrees with the rules", s);
  if (!st.ok()) {
    if (st.code() != Code::kInvalidArgument) fail("rejection is not kInvalidArgument", s);
    if (st.message().empty()) fail("rejection without a message", s);
  }
  return st.ok();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  if (check(all, false)) {
    if (!check(std::string(all) + "/", true)) fail("an accepted key + '/' is not a prefix", all);
    if (all.size() <= 256)  // every leading part of a key is a prefix (quadratic: short keys only)
      for (size_t i = 0; i < all.size(); ++i)
        if (!check(all.substr(0, i), true)) fail("a leading part of an accepted key is not a prefix", all);
  }
  if (check(all, true) && !check(std::string(all) + "x", false))
    fail("an accepted prefix + 'x' is not a key", all);

  const size_t cut = all.find('\xff');
  if (cut == std::string_view::npos) return 0;
  const std::string_view prefix = all.substr(0, cut), key = all.substr(cut + 1);
  if (check(prefix, true) && check(key, false) && (prefix.empty() || prefix.back() == '/') &&
      !check(std::string(prefix) + std::string(key), false))
    fail("an accepted directory prefix + key is not a key", all);
  return 0;
}
