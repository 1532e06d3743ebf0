// Screening a Python regular expression before RE2 compiles it.
//
// Partition rules are written for Python's re; ckptio matches them with RE2,
// which shares most of the syntax. Where RE2 lacks a feature it usually
// refuses the pattern with a terse message; where the two engines read the
// same text differently, RE2 would accept it silently and match something
// else. This screen names both kinds precisely, so a rule fails loudly
// instead of sharding a leaf differently than the trainer does.
#pragma once

#include <string_view>

#include "ckptio/status.h"

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

}  // namespace ckptio
