// Where a checkpoint's objects live under a base, and how discovery reads it.
//
//   <base>/run-12/ckptio_index.json        committed step 12 (index = commit record)
//   <base>/run-12/data-<attempt>-0.bin     its data
//   <base>/run-13.tmp-<attempt>/...        a save in progress or a dead attempt (POSIX)
//   <base>/run-9.del-<attempt>/...         a step being deleted by retention (POSIX)
//
// The step name format is an option ("run-{step}" by default); discovery
// only recognises names that the configured format produces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/storage.h"

namespace ckptio {

class StepNaming {
 public:
  // `format` holds "{step}" exactly once and is otherwise a safe name
  // (no '/', no "..", not containing ".tmp-" or ".del-").
  static Result<StepNaming> make(const std::string& format);
  std::string name(int64_t step) const;
  // The step of an exact final name ("run-12" -> 12); nullopt otherwise.
  std::optional<int64_t> parse(std::string_view name) const;

 private:
  std::string head_, tail_;
};

enum class StepDirKind { kFinal, kTemporary, kDeleting };

struct StepDir {
  int64_t step = 0;
  std::string name;    // directory name without trailing '/'
  StepDirKind kind = StepDirKind::kFinal;
  std::string attempt; // for temporaries and deletions
};

// A random 16-hex-digit id, unique per save attempt.
std::string new_attempt_id();

// The prefixes a step occupies; parses "run-5", "run-5.tmp-<attempt>",
// "run-5.del-<attempt>" (an attempt: 16 lowercase hex digits; anything else
// is no step directory).
std::optional<StepDir> classify_step_dir(const StepNaming& naming, std::string_view name);

// Every step directory under the root, sorted by step then name.
Result<std::vector<StepDir>> scan_step_dirs(Storage& storage, const StepNaming& naming);

// "a/b/c" -> "a/b"; "a" -> "".
inline std::string parent_of(const std::string& key) {
  const size_t slash = key.rfind('/');
  return slash == std::string::npos ? std::string() : key.substr(0, slash);
}

inline std::string index_key(const std::string& dir_name) {
  return dir_name + "/" + "ckptio_index.json";
}
inline std::string data_file_name(const std::string& attempt, int n) {
  return "data-" + attempt + "-" + std::to_string(n) + ".bin";
}

}  // namespace ckptio
