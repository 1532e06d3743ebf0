// Fuzzes the index parser (src/index/index.cc, contract in docs/format.md).
//
// Properties checked on every input:
//   - parse_index never crashes, hangs, leaks or trips a sanitizer;
//   - a rejection is Code::kDataLoss with a message free of raw control bytes
//     (messages quote hostile input and end up in logs);
//   - an accepted index is what the header promises: every shard's box lies in
//     its leaf's shape, its length is the box's bytes, its byte range lies in
//     a listed file, and the non-empty boxes of each leaf cover it exactly
//     once (checked here by brute force on small leaves, independently of the
//     parser's pairwise / sort / sweep / grid algorithms);
//   - an accepted index round-trips: serialize -> parse succeeds, gives an
//     equal Index, and serializing that gives the same text;
//   - the two readers behind parse_index agree: whenever the fast reader
//     takes a text, the strict reader accepts it too and gives an equal
//     Index; and the fast reader takes every text serialize_index writes
//     (from plain names: printable ASCII without '"' or '\\');
//   - reading a text while it arrives (parse_index_arriving, the second part
//     garbage until it is brought in) gives parse_index's result.
// Any violation calls abort(), so libFuzzer records the input as a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/index.h"
#include "src/index/index_readers.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "index_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Exact cover by marking every element, for leaves small enough to afford it.
void check_cover_brute_force(const ckptio::LeafRecord& leaf) {
  constexpr uint64_t kMaxElements = 1 << 16;
  const auto n = ckptio::checked_num_bytes(leaf.shape);
  if (!n || *n > kMaxElements) return;
  std::vector<uint8_t> hits(*n, 0);
  const size_t r = leaf.shape.size();
  for (const auto& s : leaf.shards) {
    bool empty = false;
    for (size_t d = 0; d < r; ++d) empty |= s.box.start[d] == s.box.stop[d];
    if (empty) continue;
    std::vector<int64_t> idx = s.box.start;
    for (;;) {
      uint64_t flat = 0;
      for (size_t d = 0; d < r; ++d) flat = flat * leaf.shape[d] + idx[d];
      if (hits[flat]++) fail("accepted overlapping shards", leaf.path);
      size_t d = r;
      while (d > 0 && ++idx[d - 1] == s.box.stop[d - 1]) {
        idx[d - 1] = s.box.start[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  for (uint8_t h : hits)
    if (!h) fail("accepted shards that leave a hole", leaf.path);
}

void check_invariants(const ckptio::Index& index) {
  std::map<std::string, uint64_t> files;
  for (const auto& f : index.files) {
    if (!ckptio::is_safe_relative_name(f.name) || f.name.find('/') != std::string::npos)
      fail("accepted an unsafe data file name", f.name);
    if (!files.emplace(f.name, f.size).second) fail("accepted a duplicate data file", f.name);
  }
  for (const auto& p : index.prefixes) {
    if (!ckptio::is_safe_relative_name(p.name)) fail("accepted an unsafe prefix name", p.name);
    for (const auto& leaf : p.leaves) {
      if (leaf.path.empty()) fail("accepted an empty leaf path", p.name);
      if (!ckptio::checked_num_bytes(leaf.shape, ckptio::dtype_size(leaf.dtype)))
        fail("accepted a shape whose bytes overflow", leaf.path);
      for (const auto& s : leaf.shards) {
        if (s.box.start.size() != leaf.shape.size() || s.box.stop.size() != leaf.shape.size())
          fail("accepted a box of the wrong rank", leaf.path);
        for (size_t d = 0; d < leaf.shape.size(); ++d)
          if (s.box.start[d] < 0 || s.box.start[d] > s.box.stop[d] || s.box.stop[d] > leaf.shape[d])
            fail("accepted a box outside the shape", leaf.path);
        const auto bytes = ckptio::checked_num_bytes(s.box.extent(), ckptio::dtype_size(leaf.dtype));
        if (!bytes || *bytes != s.length) fail("accepted a length that is not the box's bytes", leaf.path);
        auto f = files.find(s.file);
        if (f == files.end()) fail("accepted a shard in an unlisted file", s.file);
        if (s.offset > f->second || s.length > f->second - s.offset)
          fail("accepted a shard beyond its file", leaf.path);
      }
      check_cover_brute_force(leaf);
    }
  }
}

// Names the fast reader takes as they are written (it leaves escapes and
// non-ASCII text to the strict reader).
bool plain(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x80 || c == '"' || c == '\\')
      return false;
  return true;
}

bool plain_names(const ckptio::Index& index) {
  for (const auto& f : index.files)
    if (!plain(f.name)) return false;
  for (const auto& p : index.prefixes) {
    if (!plain(p.name)) return false;
    for (const auto& leaf : p.leaves) {
      if (!plain(leaf.path)) return false;
      for (const auto& s : leaf.shards)
        if (!plain(s.file)) return false;
    }
  }
  return index.prefixes.size() <= 64;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptio::IndexLimits limits;
  limits.max_bytes = 1 << 20;  // keeps each execution fast; the real limit is 256 MiB
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto first = ckptio::parse_index(text, limits);
  auto strict = ckptio::index_readers::read_index_strict(text, limits);
  if (first.ok() != strict.ok() || (first.ok() && !(*first == *strict)) ||
      (!first.ok() && first.status().to_string() != strict.status().to_string()))
    fail("parse_index and the strict reader differ", std::string(text));
  ckptio::Index fast;
  const bool fast_took = ckptio::index_readers::read_index_fast(text, limits, &fast);
  if (fast_took && !(strict.ok() && fast == *strict))
    fail("the fast reader took a text the strict reader reads otherwise",
         (strict.ok() ? std::string("different index") : strict.status().to_string()) + "\n" + std::string(text));
  // A helper thread reading leaves from a split point (at the last leaf's
  // '{"path"', where large texts split near the middle) changes nothing.
  if (const size_t split = text.rfind("{\"path\""); split != std::string_view::npos) {
    ckptio::Index two;
    const bool two_took = ckptio::index_readers::read_index_fast(text, limits, &two, split);
    if (two_took != fast_took || (two_took && !(two == fast)))
      fail("the fast reader with a helper thread differs from one thread", std::string(text));
  }
  // Read while it arrives: the bytes after `loaded` are garbage until the
  // rest is brought in (on the helper thread), so a reader that looked at
  // them early would differ from parse_index. Split at the last leaf.
  {
    const size_t split = text.rfind("{\"path\"");
    const size_t loaded = split == std::string_view::npos ? size / 2 : split + (size - split) / 2;
    std::string arriving(text.substr(0, loaded));
    arriving.resize(size, '}');
    int calls = 0;
    const std::function<ckptio::Status()> rest = [&] {
      ++calls;
      arriving.replace(loaded, size - loaded, text.substr(loaded));
      return ckptio::Status::OK();
    };
    auto third = ckptio::index_readers::parse_index_arriving(arriving, loaded, rest, limits,
                                                              split == std::string_view::npos ? std::optional<size_t>()
                                                                                              : std::optional<size_t>(split));
    if (calls != 1) fail("parse_index_arriving did not bring the rest exactly once", std::to_string(calls));
    if (third.ok() != first.ok() || (third.ok() && !(*third == *first)) ||
        (!third.ok() && third.status().to_string() != first.status().to_string()))
      fail("parse_index_arriving differs from parse_index", std::string(text));
  }
  if (!first.ok()) {
    const ckptio::Status& st = first.status();
    if (st.code() != ckptio::Code::kDataLoss) fail("rejection is not kDataLoss", st.to_string());
    if (st.message().empty()) fail("rejection without a message", "");
    for (char c : st.message())
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control byte in message", st.message());
    return 0;
  }
  check_invariants(*first);

  // The serialized text may be longer than the input (it is indented), so it
  // is read back with the default limits, as the manager reads its own.
  const std::string once = ckptio::serialize_index(*first);
  auto second = ckptio::parse_index(once);
  if (!second.ok()) fail("serialized index does not parse", second.status().to_string() + "\n" + once);
  if (!(*second == *first)) fail("parse(serialize(x)) != x", once);
  if (plain_names(*first) && !ckptio::index_readers::read_index_fast(once, {}, &fast))
    fail("the fast reader refused a serialized index", once);
  const std::string twice = ckptio::serialize_index(*second);
  if (twice != once) fail("serialization is not stable", once + "\n---\n" + twice);
  return 0;
}
