// ISO 8601 times from outside data: S3's and STS's ("2026-11-23T17:50:30.000Z")
// and Python's datetime.isoformat() in eformer's metadata.json
// ("2025-11-02T10:20:30.123456", "...+01:00"). One strict reader for both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ckptio {

// What may follow the seconds and their fraction.
enum class TimeZones {
  kUtc,  // "Z", "z" or "+00:00" only (S3, STS, IMDS)
  kAny,  // also nothing (taken as UTC) or "+HH:MM" / "-HH:MM" (Python's)
};

// "YYYY-MM-DDTHH:MM:SS" ('t' for 'T' too), an optional fraction of one or
// more digits (those past the nanosecond dropped), then a zone as `zones`
// allows, as nanoseconds since the Unix epoch. nullopt for anything else: a
// sign or space among the digits, a day the month lacks, a field out of
// range (seconds up to 60, a leap second), or a time int64 nanoseconds
// cannot hold (before 1677-09-21T00:12:44Z, after 2262-04-11T23:47:16Z).
std::optional<int64_t> parse_iso8601_ns(std::string_view text, TimeZones zones);

// The other way, for what ckptio prints (the CLI's --json, Python's
// inspect()): "2024-05-01T10:34:56.123Z", UTC, milliseconds.
std::string format_iso8601_ns(int64_t unix_ns);

}  // namespace ckptio
