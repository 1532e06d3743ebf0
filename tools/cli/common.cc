// Helpers shared by the subcommands (see cli.h).
#include <sys/resource.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <sstream>

#include "tools/cli/cli.h"
#include "src/util/iso8601.h"
#include "src/util/printable.h"

namespace ckptio::cli {

void fail(int code, const std::string& message) { throw CliError(code, message); }

void fail_status(const Status& st, const std::string& context, int code) {
  std::string msg = st.message().empty() ? std::string(code_name(st.code())) : st.message();
  fail(code, context.empty() ? msg : context + ": " + msg);
}

int exit_code_for(const Status& st) {
  switch (st.code()) {
    case Code::kOk: return kExitOk;
    case Code::kNotFound: return kExitNotFound;
    case Code::kInvalidArgument: return kExitUsage;
    default: return kExitFailed;
  }
}

// ---- SIZE -------------------------------------------------------------------

std::optional<uint64_t> parse_size(std::string_view text) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
  };
  text = trim(text);
  size_t i = 0;
  unsigned __int128 whole = 0;
  bool digits = false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    whole = whole * 10 + (text[i] - '0');
    if (whole > UINT64_MAX) return std::nullopt;
    digits = true;
  }
  // The fraction as the exact ratio frac / scale: in floating point,
  // "16.777216MB" came out one byte short (16777215). Digits past the 24th
  // are dropped: at the largest unit (2^40) they are worth < 10^-11 bytes.
  constexpr unsigned __int128 kMaxScale = [] {
    unsigned __int128 s = 1;
    for (int k = 0; k < 24; ++k) s *= 10;
    return s;
  }();
  unsigned __int128 frac = 0, scale = 1;
  if (i < text.size() && text[i] == '.') {
    for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
      if (scale < kMaxScale) {
        frac = frac * 10 + (text[i] - '0');
        scale *= 10;
      }
      digits = true;
    }
  }
  if (!digits) return std::nullopt;
  std::string unit;
  for (char c : trim(text.substr(i))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},          {"b", 1},
      {"k", 1ull << 10}, {"ki", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
      {"m", 1ull << 20}, {"mi", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000'000ull},
      {"g", 1ull << 30}, {"gi", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000'000'000ull},
      {"t", 1ull << 40}, {"ti", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000'000'000'000ull},
  };
  for (const auto& [name, mult] : kUnits) {
    if (unit != name) continue;
    unsigned __int128 v = whole * mult;
    v += frac * mult / scale;  // < 10^24 * 2^40 < 2^128
    if (v > UINT64_MAX) return std::nullopt;
    return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

uint64_t size_arg(const std::string& text, const std::string& option) {
  auto v = parse_size(text);
  if (!v)
    fail(kExitUsage, "bad SIZE '" + text + "' for " + option +
                         " (expected bytes or a number with KiB/MiB/GiB/TiB or KB/MB/GB/TB)");
  return *v;
}

uint64_t positive_size_arg(const std::string& text, const std::string& option) {
  const uint64_t v = size_arg(text, option);
  if (v == 0) fail(kExitUsage, option + " must be > 0");
  return v;
}

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (!v.empty() && v[0] == '-') return "must be >= 0, got " + v;
        return "";
      },
      "NONNEGATIVE");
}

CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        double d = 0;
        size_t used = 0;
        try {
          d = std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != v.size() || !(d > 0)) return "must be > 0, got " + v;
        return "";
      },
      "POSITIVE");
}

namespace {

// CLI11 (2.1) reads an integer with strtoll / strtoull in base 0 and does not
// check for overflow: "--step 010" was step 8, "--keep-last 010" kept 8
// steps, "0x10" was 16, and a number beyond 64 bits saturated
// ("--step 99999999999999999999" saved step 9223372036854775807) or, for an
// unsigned option, "-1" wrapped to 2^64 - 1. This transform runs before that
// conversion: an optional sign and decimal digits, within T's range, handed
// on without leading zeros (CLI11 still refuses what does not fit a
// narrower option).
template <typename T>
CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::string_view digits = v;
        if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
        T n{};
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
        if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
          return "expected a decimal integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                 std::to_string(std::numeric_limits<T>::max()) + "], got " + v;
        v = std::to_string(n);
        return "";
      },
      "");
}

// CLI11's NonNegativeNumber and PositiveNumber let "nan" through (no
// comparison holds): "--min-age nan" reached the library and failed as an
// operation (exit 1) instead of a usage error.
CLI::Validator not_nan() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        return std::isnan(std::strtod(v.c_str(), nullptr)) ? "expected a number, got " + v : "";
      },
      "");
}

}  // namespace

void strict_numbers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (base == "INT") opt->transform(decimal_integer<int64_t>());
    else if (base == "UINT") opt->transform(decimal_integer<uint64_t>());
    else if (base == "FLOAT") opt->transform(not_nan());
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) strict_numbers(*sub);
}

// ---- Output -----------------------------------------------------------------

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

double gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

std::string format_gbps(uint64_t bytes, double seconds) {
  char buf[32];
  double r = gbps(bytes, seconds);
  if (seconds <= 0) return "n/a GB/s";
  if (r < 0.1) std::snprintf(buf, sizeof buf, "%.1f MB/s", r * 1000);
  else std::snprintf(buf, sizeof buf, "%.2f GB/s", r);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s < 1) std::snprintf(buf, sizeof buf, "%.0f ms", s * 1000);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string format_time_local(int64_t unix_ns) {
  if (unix_ns <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json iso_time_or_null(int64_t unix_ns) {
  return unix_ns > 0 ? nlohmann::json(format_iso8601_ns(unix_ns)) : nlohmann::json(nullptr);
}

std::string terminal_text(std::string_view s) {
  return printable(s, Printable{SIZE_MAX, /*ascii=*/false, /*keep_lines=*/true});
}

std::string format_table(const std::vector<std::vector<std::string>>& rows_in,
                         const std::vector<bool>& right) {
  std::vector<std::vector<std::string>> rows = rows_in;  // (cells may quote a checkpoint's names)
  for (auto& row : rows)
    for (auto& cell : row) cell = terminal_text(cell);
  std::vector<size_t> width;
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.resize(c + 1, 0);
      width[c] = std::max(width[c], row[c].size());
    }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string& cell = row[c];
      const size_t pad = width[c] - cell.size();
      const bool r = c < right.size() && right[c];
      if (c > 0) line += "  ";
      if (r) line.append(pad, ' ');
      line += cell;
      if (!r && c + 1 < row.size()) line.append(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

double round_to(double v, int digits) {
  const double m = std::pow(10.0, digits);
  return std::round(v * m) / m;
}

// ---- URIs and managers -----------------------------------------------------

bool is_mem_uri(const std::string& uri) { return uri.rfind("mem://", 0) == 0; }

std::optional<std::string> local_path(const std::string& uri) {
  if (uri.rfind("file://", 0) == 0) {
    if (uri.size() == 7 || uri[7] != '/') return std::nullopt;  // open() says why
    return uri.substr(7);
  }
  if (uri.find("://") != std::string::npos) return std::nullopt;
  return uri;
}

std::string join_uri(const std::string& uri, const std::string& name) {
  if (!uri.empty() && uri.back() == '/') return uri + name;
  return uri + "/" + name;
}

std::string step_dir_name(const GlobalOptions& g, int64_t step) {
  std::string s = g.step_format;
  const size_t at = s.find("{step}");
  if (at != std::string::npos) s.replace(at, 6, std::to_string(step));
  return s;
}

ManagerOptions manager_options(const GlobalOptions& g) {
  ManagerOptions o;
  o.step_format = g.step_format;
  o.strict = g.strict;
  if (!g.chunk_size.empty()) o.chunk_size = positive_size_arg(g.chunk_size, "--chunk-size");
  if (!g.staging_budget.empty()) o.staging_budget = positive_size_arg(g.staging_budget, "--staging-budget");
  return o;
}

StorageOptions storage_options(const GlobalOptions& g) {
  StorageOptions o;
  LocalOptions& local = o.get<LocalOptions>();
  local.direct_io = g.direct_io;
  local.read_mode = g.read_mode;
  if (!g.request_size.empty()) local.request_size = positive_size_arg(g.request_size, "--request-size");
  local.queue_depth = g.queue_depth;

  S3Options& s3 = o.get<S3Options>();
  s3.endpoint = g.s3_endpoint;
  s3.region = g.s3_region;
  s3.profile = g.s3_profile;
  // The backend checks the range (S3's smallest part is 5 MiB): one rule, one place.
  if (!g.s3_part_size.empty()) s3.part_size = positive_size_arg(g.s3_part_size, "--s3-part-size");
  s3.max_connections = g.s3_max_connections;
  s3.addressing = g.s3_addressing;
  s3.anonymous = g.s3_anonymous;
  s3.max_attempts = g.s3_max_attempts;
  s3.timeout_s = g.s3_timeout_s;
  s3.checksums = g.s3_checksums;
  s3.sse = g.s3_sse;
  s3.sse_kms_key_id = g.s3_sse_kms_key_id;
  s3.storage_class = g.s3_storage_class;
  return o;
}

void check_location(const std::string& uri, Access access) {
  if (uri.empty()) fail(kExitUsage, "empty URI");
  if (auto path = local_path(uri); path && access == Access::kRead) {
    // open() creates a missing root; reading commands must not.
    struct stat st {};
    if (path->empty() || ::stat(path->c_str(), &st) != 0) {
      if (errno == ENOENT || path->empty()) fail(kExitNotFound, "no such directory: " + uri);
      fail_status(Status::from_errno(errno, *path), "", kExitFailed);
    }
    if (!S_ISDIR(st.st_mode)) fail(kExitUsage, "not a directory: " + uri);
  }
}

std::shared_ptr<Storage> open_storage_at(const GlobalOptions& g, const std::string& uri,
                                         Access access) {
  check_location(uri, access);
  auto s = open_storage(uri, storage_options(g));
  if (!s.ok()) {
    const int code = s.status().code() == Code::kInvalidArgument ? kExitUsage : kExitFailed;
    fail_status(s.status(), "open " + uri, code);
  }
  return std::move(s).value();
}

std::unique_ptr<CheckpointManager> open_manager(const GlobalOptions& g, const std::string& uri,
                                                Access access, ManagerOptions options) {
  check_location(uri, access);
  auto m = CheckpointManager::open(uri, std::move(options), storage_options(g));
  if (!m.ok()) {
    const int code = m.status().code() == Code::kInvalidArgument ? kExitUsage : kExitFailed;
    fail_status(m.status(), "open " + uri, code);
  }
  return std::move(m).value();
}

Index resolve_index(CheckpointManager& m, const std::string& uri, std::optional<int64_t> step) {
  if (!step) {
    auto latest = m.latest_step();
    if (!latest.ok()) fail_status(latest.status(), "find the latest step at " + uri);
    if (!latest->has_value()) {
      // Steps there, every one damaged: a failure, not "nothing here" (a
      // wrapper that reads exit 3 as a fresh start would start over on top
      // of them). committed_or_damaged_steps exits 3 when there is none.
      const std::vector<int64_t> damaged = committed_or_damaged_steps(m, uri);
      const Status why = m.read_index(damaged.back()).status();
      fail(kExitFailed, "no intact committed step at " + uri + ": " +
                            (damaged.size() == 1 ? "step " : "the newest of " + std::to_string(damaged.size()) +
                                                                 " damaged steps, ") +
                            std::to_string(damaged.back()) + ", is damaged: " +
                            (why.ok() ? std::string("(its index now reads)") : why.message()));
    }
    step = **latest;
  }
  auto index = m.read_index(*step);
  if (!index.ok()) {
    const int code = index.status().code() == Code::kNotFound ? kExitNotFound : kExitFailed;
    fail_status(index.status(), "step " + std::to_string(*step), code);
  }
  return std::move(index).value();
}

std::vector<int64_t> committed_or_damaged_steps(CheckpointManager& m, const std::string& uri) {
  auto dirs = m.list_step_dirs();
  if (!dirs.ok()) fail_status(dirs.status(), "list " + uri);
  std::vector<int64_t> steps;
  for (const StepInfo& d : *dirs) {
    if (d.name.find(".tmp-") != std::string::npos || d.name.find(".del-") != std::string::npos) continue;
    if (d.committed) {
      steps.push_back(d.step);
      continue;
    }
    const Status st = m.read_index(d.step).status();
    if (st.code() == Code::kNotFound) continue;  // not committed: a save in progress, a dead attempt
    // Damaged, or a step ckptio cannot read (an eformer step's codec it
    // lacks): listed, for the caller to report (before, one such step
    // stopped verify and synth check before the newer steps were checked).
    if (!st.data_loss() && st.code() != Code::kUnimplemented) fail_status(st, "step " + std::to_string(d.step));
    steps.push_back(d.step);
  }
  if (steps.empty()) fail(kExitNotFound, "no committed step at " + uri);
  return steps;
}

namespace {

// The value in kB of a "Key:   123 kB" line of a /proc file, in bytes.
uint64_t proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

}  // namespace

uint64_t peak_rss_bytes() {
  if (uint64_t v = proc_kb("/proc/self/status", "VmHWM")) return v;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

bool reset_peak_rss() {
  int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

uint64_t mem_available_bytes() { return proc_kb("/proc/meminfo", "MemAvailable"); }

void require_memory(uint64_t bytes, const std::string& what) {
  const uint64_t avail = mem_available_bytes();
  if (avail == 0 || bytes <= avail / 10 * 9) return;
  fail(kExitFailed, what + " needs " + format_bytes(bytes) + " of memory, only " +
                        format_bytes(avail) + " is available");
}

}  // namespace ckptio::cli
