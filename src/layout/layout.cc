#include "src/layout/layout.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cerrno>
#include <random>

#include <sys/random.h>
#include <unistd.h>

namespace ckptio {

Result<StepNaming> StepNaming::make(const std::string& format) {
  const std::string token = "{step}";
  size_t at = format.find(token);
  if (at == std::string::npos || format.find(token, at + 1) != std::string::npos)
    return invalid_argument("step format '" + format + "' must contain {step} exactly once");
  if (format.find('/') != std::string::npos || format.find("..") != std::string::npos ||
      format.find('\\') != std::string::npos || format.find('\0') != std::string::npos ||
      format.find(".tmp-") != std::string::npos || format.find(".del-") != std::string::npos)
    return invalid_argument("step format '" + format + "' is not a safe directory name");
  StepNaming n;
  n.head_ = format.substr(0, at);
  n.tail_ = format.substr(at + token.size());
  if (!n.tail_.empty() && std::isdigit(static_cast<unsigned char>(n.tail_[0])))
    return invalid_argument("step format '" + format + "': {step} must not be followed by a digit");
  // Every directory name made of it must be one a storage takes, a stage
  // directory's too (<name>.tmp-<16 hex digits>): a format ending in '.'
  // made "5..tmp-..." (refused as '..'), a long one names past a file
  // system's 255 bytes, and every save failed.
  const std::string longest = n.name(INT64_MAX) + ".tmp-0123456789abcdef";
  if (longest.size() > 255 || !check_storage_key(longest + "/x").ok())
    return invalid_argument("step format '" + format + "' makes directory names a storage refuses (" + longest +
                            "): it may not end in '.', and a name may have at most 255 bytes");
  return n;
}

std::string StepNaming::name(int64_t step) const { return head_ + std::to_string(step) + tail_; }

std::optional<int64_t> StepNaming::parse(std::string_view name) const {
  if (name.size() <= head_.size() + tail_.size()) return std::nullopt;
  if (name.substr(0, head_.size()) != head_) return std::nullopt;
  if (name.substr(name.size() - tail_.size()) != tail_) return std::nullopt;
  std::string_view digits = name.substr(head_.size(), name.size() - head_.size() - tail_.size());
  if (digits.empty() || digits.size() > 19) return std::nullopt;
  // Decimal digits only: from_chars takes a '-', and "-0" was step 0 (so
  // "run-{step}" and "run{step}" each claimed the other's run-0).
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;  // one spelling per step
  int64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || p != digits.data() + digits.size() || v < 0) return std::nullopt;
  return v;
}

std::string new_attempt_id() {
  // 64 bits from the kernel's generator at every call: a seeded generator
  // kept in memory would be copied into every child a process forks, which
  // would then name their attempts as their parent's next one (two writers
  // of a step in one staging directory, or over one set of data objects).
  uint64_t v = 0;
  ssize_t got = 0;
  do got = ::getrandom(&v, sizeof v, 0);
  while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof v)) {  // no getrandom (very old kernel): the C++ runtime's source
    std::random_device rd;
    v = static_cast<uint64_t>(rd()) << 32 ^ rd();
  }
  static const char* hex = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = hex[v & 15];
  return s;
}

std::optional<StepDir> classify_step_dir(const StepNaming& naming, std::string_view name) {
  StepDir d;
  d.name = std::string(name);
  for (auto [marker, kind] : {std::pair{".tmp-", StepDirKind::kTemporary},
                              std::pair{".del-", StepDirKind::kDeleting}}) {
    size_t at = name.rfind(marker);
    if (at == std::string_view::npos) continue;
    // An attempt id is what new_attempt_id() and group_attempt_id() make: 16
    // lowercase hex digits. Anything else ("2024.tmp-notes/" beside steps
    // named "{step}") is not ckptio's, and gc must leave it alone.
    const std::string_view attempt = name.substr(at + 5);
    if (attempt.size() != 16 ||
        !std::all_of(attempt.begin(), attempt.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
      return std::nullopt;
    auto step = naming.parse(name.substr(0, at));
    if (!step) return std::nullopt;
    d.step = *step;
    d.kind = kind;
    d.attempt = std::string(attempt);
    return d;
  }
  auto step = naming.parse(name);
  if (!step) return std::nullopt;
  d.step = *step;
  return d;
}

Result<std::vector<StepDir>> scan_step_dirs(Storage& storage, const StepNaming& naming) {
  CKPTIO_ASSIGN_OR_RETURN(ListResult listed, storage.list("", /*delimiter=*/true));
  std::vector<StepDir> out;
  for (const std::string& p : listed.prefixes) {
    std::string_view name = p;
    if (!name.empty() && name.back() == '/') name.remove_suffix(1);
    if (auto d = classify_step_dir(naming, name)) out.push_back(std::move(*d));
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) {
    return a.step != b.step ? a.step < b.step : a.name < b.name;
  });
  return out;
}

}  // namespace ckptio
