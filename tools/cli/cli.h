// What the `ckptio` subcommands share: exit codes, errors, global options,
// SIZE and URI handling, output formatting and the progress line.
//
// Each subcommand lives in its own file and registers itself on the CLI11 app
// with add_<name>(); parsing only records which command to run, main() runs it
// and turns a CliError into "ckptio: <message>" and its exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <map>
#include <string>
#include <string_view>
#include <thread>

#include "ckptio/ckptio.h"
#include "tools/cli/synth.h"

namespace ckptio::cli {

// Exit codes (documented in the --help footer).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // the operation failed (damage found, save failed, I/O)
inline constexpr int kExitUsage = 2;     // bad command line, URI or SIZE
inline constexpr int kExitNotFound = 3;  // no such step, no committed step, no such directory

class CliError : public std::runtime_error {
 public:
  CliError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

[[noreturn]] void fail(int code, const std::string& message);
// Fails with `code`; the message is the status's ("context: message").
[[noreturn]] void fail_status(const Status& st, const std::string& context = "",
                              int code = kExitFailed);
// NotFound -> kExitNotFound, InvalidArgument -> kExitUsage, else kExitFailed.
// Only for calls where "not found" can only mean the thing the user named.
int exit_code_for(const Status& st);

struct GlobalOptions {
  std::string log_level = "warn";
  std::string direct_io = "auto";
  std::string read_mode;
  std::string chunk_size;      // SIZE; "" = the library default
  std::string staging_budget;  // SIZE; "" = the library default
  std::string request_size;    // SIZE; "" = the backend default
  uint32_t queue_depth = 0;
  std::string step_format = "run-{step}";
  bool strict = false;  // ManagerOptions::strict: damage is an error, never skipped

  // S3 (S3Options, include/ckptio/s3.h). Empty / zero = the AWS conventions and the
  // backend's defaults. Credentials are deliberately absent: they come only
  // from the environment or ~/.aws files, never from the command line, where
  // other users could read them (ps, /proc, shell history).
  std::string s3_endpoint;
  std::string s3_region;
  std::string s3_profile;
  std::string s3_part_size;  // SIZE
  uint32_t s3_max_connections = 0;
  std::string s3_addressing;  // path | virtual
  bool s3_anonymous = false;
  int s3_max_attempts = 0;
  double s3_timeout_s = 0;
  std::string s3_checksums;  // "on" | "off" | "" (the AWS conventions)
  std::string s3_sse, s3_sse_kms_key_id, s3_storage_class;
};

using Command = std::function<int()>;

// ---- SIZE -------------------------------------------------------------------
// "1000", "4KiB", "512MiB", "2GiB", "1TiB" (K/M/G/T and KiB/MiB/GiB/TiB are
// powers of 1024; KB/MB/GB/TB powers of 1000; "B" optional; case-insensitive;
// a decimal fraction is allowed: "1.5GiB"). nullopt when malformed or > 2^64-1.
std::optional<uint64_t> parse_size(std::string_view text);
// parse_size or CliError(kExitUsage) naming the option.
uint64_t size_arg(const std::string& text, const std::string& option);
// size_arg, and 0 refused: for sizes whose 0 the library reads as "the
// default" (a --chunk-size 0 would silently be 8 MiB).
uint64_t positive_size_arg(const std::string& text, const std::string& option);

// CLI11 checks for numbers >= 0 and > 0 with a one-line message.
CLI::Validator non_negative();
CLI::Validator positive();
// Makes every integer option of `app` and its subcommands take decimal
// digits only, within 64 bits, and every floating-point one refuse NaN (see
// common.cc); call once all options are added.
void strict_numbers(CLI::App& app);

// ---- Output -----------------------------------------------------------------
std::string format_bytes(uint64_t bytes);                 // "1.50 GiB"
double gbps(uint64_t bytes, double seconds);              // 1e9 bytes per second
std::string format_gbps(uint64_t bytes, double seconds);  // "1.23 GB/s"
std::string format_seconds(double s);                     // "0.85 s" / "320 ms"
std::string format_time_local(int64_t unix_ns);           // "2024-05-01 12:34:56"
// Pads each cell to its column's width; `right` marks right-aligned columns.
std::string format_table(const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& right = {});
// Serialises a double with at most `digits` decimals (JSON-friendly).
double round_to(double v, int digits);
// `--json` output: indented, and text that is not UTF-8 (a directory's name,
// a leaf's name from a checkpoint) replaced by U+FFFD rather than throwing
// (nlohmann's type_error 316: the command's work was done, its report lost).
std::string json_text(const nlohmann::json& j, int indent = 2);
// format_iso8601_ns() (src/util/iso8601.h), or null for a time not recorded (<= 0: an eformer step
// whose metadata.json has no timestamp; before, "1970-01-01T00:00:00.000Z").
nlohmann::json iso_time_or_null(int64_t unix_ns);
// Text from outside (names and messages from a checkpoint, a server) made
// safe for a terminal: printable() (src/util/printable.h) keeping newline
// and tab, uncut (an escape sequence in a leaf's name was sent raw).
std::string terminal_text(std::string_view s);

// ---- URIs and managers -----------------------------------------------------
bool is_mem_uri(const std::string& uri);
// The directory of a local URI (plain path or file:///path); nullopt otherwise.
std::optional<std::string> local_path(const std::string& uri);
std::string join_uri(const std::string& uri, const std::string& name);
std::string step_dir_name(const GlobalOptions& g, int64_t step);

enum class Access {
  kRead,   // the location must exist (a missing local directory is kExitNotFound)
  kWrite,  // a local directory is created if missing
};

ManagerOptions manager_options(const GlobalOptions& g);
StorageOptions storage_options(const GlobalOptions& g);
// Checks a location before opening it: for kRead a local directory must
// exist (kExitNotFound; open would create it) and be a directory
// (kExitUsage). Other schemes are checked by the backend when used.
void check_location(const std::string& uri, Access access);
// The backend for `uri` (check_location first); an unusable URI or option is
// kExitUsage, anything else kExitFailed.
std::shared_ptr<Storage> open_storage_at(const GlobalOptions& g, const std::string& uri,
                                         Access access);
std::unique_ptr<CheckpointManager> open_manager(const GlobalOptions& g, const std::string& uri,
                                                Access access, ManagerOptions options);
inline std::unique_ptr<CheckpointManager> open_manager(const GlobalOptions& g,
                                                       const std::string& uri, Access access) {
  return open_manager(g, uri, access, manager_options(g));
}
// The index of the step asked for, or of the latest committed one;
// kExitNotFound when there is none, kExitFailed when it cannot be read.
Index resolve_index(CheckpointManager& m, const std::string& uri, std::optional<int64_t> step);
// Ascending: every step that is committed or whose commit record is damaged
// (an index that does not parse, or a POSIX step directory that lost it):
// what verify --all checks and where synth check's restore-latest starts.
// kExitNotFound when there is none.
std::vector<int64_t> committed_or_damaged_steps(CheckpointManager& m, const std::string& uri);

// Peak resident set of this process in bytes (VmHWM, else ru_maxrss).
uint64_t peak_rss_bytes();
// Resets the peak (Linux: "5" > /proc/self/clear_refs); false if refused.
bool reset_peak_rss();
// MemAvailable from /proc/meminfo, or 0 when unknown.
uint64_t mem_available_bytes();
// Fails with kExitFailed (instead of meeting the OOM killer) when `bytes`
// exceed 90% of the available memory.
void require_memory(uint64_t bytes, const std::string& what);

// ---- Progress ---------------------------------------------------------------
// A progress line on stderr, redrawn every 200 ms from a thread, only when
// stderr is a terminal; silent otherwise. `done` reports bytes so far (may be
// empty: then a spinner with the elapsed time is shown).
class Progress {
 public:
  Progress(std::string label, uint64_t total, std::function<uint64_t()> done = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void set_label(std::string label);
  // From now on `done` reports the bytes so far, and `total` (when it gives
  // more than 0) the bytes in all: a save's handle exists only once save()
  // returned, after the line began, and knows its total once planned.
  void watch(std::function<uint64_t()> done, std::function<uint64_t()> total = {});
  void stop();  // clears the line; idempotent
  static bool enabled();

 private:
  void loop();
  std::string line(double elapsed, int tick);

  std::mutex mu_;  // guards label_, stopping_, done_, total_fn_
  std::condition_variable cv_;
  std::string label_;
  bool stopping_ = false;
  std::function<uint64_t()> done_, total_fn_;
  const uint64_t total_;
  std::thread thread_;
};

// ---- Synthetic states: restore a step and compare it with the generator ----
struct CheckOutcome {
  int64_t step = 0;
  uint64_t bytes = 0;
  size_t leaves = 0;
  double restore_seconds = 0;
  // CLOCK_MONOTONIC (steady_clock) seconds when the restored state was ready:
  // the end of the last restore, less the comparisons with the generator done
  // between batches. A parent that read the clock before starting this
  // process has the restart's time from process start (bench/restart).
  double ready_monotonic_s = 0;
  bool verified = false;
  std::string error;  // set when !verified: names the leaf (and element)
  // The failure is damage to the stored step (kDataLoss: index or data), not
  // a difference from the generator or an I/O error.
  bool damaged = false;
};
// Restores `step` (whole, or in batches of leaves when it would not fit in
// half the available memory, or above `batch_bytes` when that is > 0) and
// compares every byte with the generator described by its "synth" metadata.
// Returns verified = false with `error` for damage or a mismatch; throws
// CliError for steps without synth metadata. prefault: RestoreOptions::prefault.
CheckOutcome check_synth_step(CheckpointManager& m, int64_t step, bool show_progress = true,
                              uint64_t batch_bytes = 0, bool prefault = true);
// The index metadata that check_synth_step reads: {"synth": {"seed", "bytes"
// (the requested size, input of the layout), "leaves", "generator", "layout",
// "total_bytes", "versions": {"prefix/path": version} (only non-zero ones)}}.
// What the "synth" metadata of a step says; fails (kExitFailed) when a step
// was not written by ckptio synth save.
struct SynthMeta {
  uint64_t seed = 0;
  uint64_t bytes = 0;
  uint64_t leaves = 0;
  std::map<std::string, uint64_t> versions;  // "prefix/path" -> version (demo)
};
SynthMeta parse_synth_meta(const std::string& metadata_json, int64_t step);
// Leaf-set check of a layout against an index: names, dtypes, shapes. ""
// when equal.
std::string compare_leaf_set(const ckptio::synth::Layout& layout, const Index& index);

std::string synth_metadata_json(uint64_t seed, uint64_t target_bytes, uint64_t leaves,
                                uint64_t total_bytes,
                                const std::vector<std::pair<std::string, uint64_t>>& versions = {});

// ---- Subcommands ------------------------------------------------------------
void add_ls(CLI::App& app, const GlobalOptions& g, Command* run);
void add_inspect(CLI::App& app, const GlobalOptions& g, Command* run);
void add_verify(CLI::App& app, const GlobalOptions& g, Command* run);
void add_gc(CLI::App& app, const GlobalOptions& g, Command* run);
void add_synth(CLI::App& app, const GlobalOptions& g, Command* run);
void add_demo(CLI::App& app, const GlobalOptions& g, Command* run);
void add_bench(CLI::App& app, const GlobalOptions& g, Command* run);
void add_cp(CLI::App& app, const GlobalOptions& g, Command* run);

}  // namespace ckptio::cli
