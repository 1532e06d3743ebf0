// Screening a Python regular expression before RE2 compiles it.
//
// Partition rules are written for Python's re; ckptio matches them with RE2,
// which shares most of the syntax. Where RE2 lacks a feature it usually
// refuses the pattern with a terse message; where the two engines read the
// same text differently, RE2 would accept it silently and match something
// else. This screen names both kinds precisely, so a rule fails loudly
// instead of sharding a leaf differently than the trainer does.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ckptio/status.h"

namespace re2 {
class RE2;
}

namespace ckptio {

// OK, or kInvalidArgument describing the first construct (outside character
// classes unless said) that Python's re and RE2 do not share:
//   lookahead/lookbehind (?= (?! (?<= (?<!, backreferences \1..\9 and (?P=name),
//   atomic groups (?>, conditionals (?(, comments (?#, the inline flags x a u L,
//   \Z (Python's end of text; RE2 spells it \z), {,n} and {,} (Python: a
//   repetition from 0; RE2: literal text), and [:name:] inside a class
//   (RE2: a POSIX class; Python: the characters themselves).
// Anything else is left to RE2, which refuses what it cannot parse.
Status check_python_regex(std::string_view pattern);

// The pattern screened as above, then compiled by RE2 for "does it match"
// questions (no capture groups, errors as values). `what` names the pattern
// in errors ("rules[3]", "path regex"). Matching with RE2::PartialMatch is
// re.search: linear in the text whatever the pattern, so safe on names read
// from outside data, and thread-safe.
Result<std::unique_ptr<const re2::RE2>> compile_python_regex(const std::string& pattern, const std::string& what);

}  // namespace ckptio
