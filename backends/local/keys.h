// Keys of the local backend: validation, prefix splitting, and the names of
// the backend's own temporary files. Pure functions.
//
// A key is a '/'-separated path relative to the root. Rejected (kInvalidArgument):
// empty keys, a leading '/', "..", NUL, backslash, empty or "." components
// ("a//b", "./a": they would list back under another spelling), and names
// that look like our temporary files.
//
// Temporary files: put() and create() write "<name>.tmp-ckptio-<16 hex>" next
// to the key and rename it over the key when done. list() skips regular files
// with that name, so a crashed writer's leftovers never show as objects; they
// go away with remove_prefix() of their directory. The core's own staging
// directories ("run-5.tmp-<attempt>/") are directories, never skipped.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "ckptio/status.h"

namespace ckptio::local {

Status check_key(std::string_view key);
// A prefix may be empty, may end in '/', and may end mid-name ("run-").
Status check_prefix(std::string_view prefix);

// "a/b/run-" -> {"a/b/", "run-"}; "a/b/" -> {"a/b/", ""}; "run-" -> {"", "run-"}.
std::pair<std::string_view, std::string_view> split_prefix(std::string_view prefix);

inline constexpr std::string_view kTempMarker = ".tmp-ckptio-";
// A fresh random temporary name for `path` ("/r/a/index.json.tmp-ckptio-0f3a...").
std::string temp_path_for(const std::string& path);
bool is_temp_name(std::string_view name);

}  // namespace ckptio::local
