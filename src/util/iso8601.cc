#include "src/util/iso8601.h"

#include <cstdio>
#include <ctime>

namespace ckptio {
namespace {

// Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar
// (H. Hinnant's days_from_civil).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

}  // namespace

std::optional<int64_t> parse_iso8601_ns(std::string_view s, TimeZones zones) {
  // Fixed places, digits only (sscanf's %d would take signs and spaces).
  auto num = [&](size_t at, size_t n, int64_t lo, int64_t hi) -> std::optional<int64_t> {
    if (at + n > s.size()) return std::nullopt;
    int64_t v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return std::nullopt;
    return v;
  };
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' ||
      s[16] != ':')
    return std::nullopt;
  const auto y = num(0, 4, 0, 9999), mo = num(5, 2, 1, 12), d = num(8, 2, 1, 31), h = num(11, 2, 0, 23),
             mi = num(14, 2, 0, 59), se = num(17, 2, 0, 60);
  if (!y || !mo || !d || !h || !mi || !se) return std::nullopt;
  static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (*y % 4 == 0 && *y % 100 != 0) || *y % 400 == 0;
  if (*d > kDays[*mo - 1] || (*mo == 2 && *d == 29 && !leap)) return std::nullopt;
  size_t at = 19;
  int64_t frac_ns = 0;
  if (at < s.size() && s[at] == '.') {
    size_t digits = 0;
    for (++at; at < s.size() && s[at] >= '0' && s[at] <= '9'; ++at, ++digits)
      if (digits < 9) frac_ns = frac_ns * 10 + (s[at] - '0');
    if (digits == 0) return std::nullopt;
    for (size_t k = digits; k < 9; ++k) frac_ns *= 10;
  }
  const std::string_view zone = s.substr(at);
  int64_t offset_s = 0;  // local time minus UTC
  if (zone == "Z" || zone == "z" || zone == "+00:00") {
  } else if (zones == TimeZones::kAny && zone.empty()) {
  } else if (zones == TimeZones::kAny && zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && zone[3] == ':') {
    const auto oh = num(at + 1, 2, 0, 23), om = num(at + 4, 2, 0, 59);
    if (!oh || !om) return std::nullopt;
    offset_s = (zone[0] == '+' ? 1 : -1) * (*oh * 3600 + *om * 60);
  } else {
    return std::nullopt;
  }
  // (At most ~3.2e11 s either way: no overflow before the nanoseconds.)
  const int64_t seconds = days_from_civil(*y, *mo, *d) * 86400 + *h * 3600 + *mi * 60 + *se - offset_s;
  int64_t ns;
  if (__builtin_mul_overflow(seconds, int64_t{1'000'000'000}, &ns) || __builtin_add_overflow(ns, frac_ns, &ns))
    return std::nullopt;
  return ns;
}

std::string format_iso8601_ns(int64_t unix_ns) {
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>((unix_ns / 1'000'000) % 1000));
  return out;
}

}  // namespace ckptio
