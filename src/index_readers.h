// The two readers behind parse_index (src/index.cc), for the fuzzer and the
// tests that hold them to one another. parse_index(text) is
// read_index_fast(text) when that takes the text, else read_index_strict(text).
#pragma once

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

}  // namespace ckptio::index_readers
