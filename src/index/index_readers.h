// The two readers behind parse_index (src/index/index.cc), for the fuzzer and the
// tests that hold them to one another. parse_index(text) is
// read_index_fast(text) when that takes the text, else read_index_strict(text).
// They live in src/index/fast_reader.cc and src/index/strict_reader.cc;
// docs/format.md is their contract.
#pragma once

#include <functional>
#include <optional>
#include <string_view>

#include "ckptio/index.h"

namespace ckptio::index_readers {

// The strict reader alone: every valid index, every rejection named by its
// JSON location.
Result<Index> read_index_strict(std::string_view json, const IndexLimits& limits = {});

// The fast reader alone: true and *out filled for the plain form of a valid
// index (what serialize_index writes); false for anything else, which it
// leaves to the strict reader. Whenever it returns true, read_index_strict
// accepts the same text and returns an equal Index.
bool read_index_fast(std::string_view json, const IndexLimits& limits, Index* out);
// The same with a helper thread reading leaves from byte `split` on, for any
// text (read_index_fast splits large texts near the middle by itself);
// std::string_view::npos: one thread. The result never depends on `split`.
bool read_index_fast(std::string_view json, const IndexLimits& limits, Index* out, size_t split);

// parse_index of a text that is still arriving: json[0, loaded) is in, and
// rest() brings in the remainder (json's memory stays the caller's). The
// first part is read while rest() runs on a helper thread, for a large text
// whose first part holds a split point; otherwise rest() is called first.
// rest() is called once, before an Index or a parse error is returned (not
// after an allocation failure, kInternal); its error is returned. The Index
// is parse_index(json)'s. `split`: where the helper
// reads leaves (any byte; tests and the fuzzer), by default the last
// '{"path"' of the first part of a large text.
Result<Index> parse_index_arriving(std::string_view json, size_t loaded, const std::function<Status()>& rest,
                                   const IndexLimits& limits = {}, std::optional<size_t> split = std::nullopt);

}  // namespace ckptio::index_readers
