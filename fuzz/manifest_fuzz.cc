// Fuzzes the manifest reader of multi-process save (src/save/manifest.cc,
// docs/multiprocess.md): the coordinator reads N manifests other processes
// wrote to shared storage, so each is outside data.
//
// Properties checked on every input (any violation aborts):
//   - parse_manifest never crashes, hangs, leaks or trips a sanitizer;
//   - a rejection is kDataLoss;
//   - an accepted manifest has a lowercase-hex attempt and
//     0 <= process_index < process_count, its shards lie inside their
//     leaves and their files, and no two shards of a leaf overlap;
//   - it round-trips: serialize_manifest -> parse_manifest gives the same
//     identity, error and index;
//   - merging it with itself as two processes either fails (kFailedPrecondition,
//     which a non-empty leaf must: every box is then written twice) or the
//     merged index parses as a step's index.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "src/save/manifest.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

bool overlap(const ckptio::Box& a, const ckptio::Box& b) {
  for (size_t d = 0; d < a.rank(); ++d)
    if (std::max(a.start[d], b.start[d]) >= std::min(a.stop[d], b.stop[d])) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (size > (1 << 20)) return 0;
  auto m = ckptio::parse_manifest(text);
  if (!m.ok()) {
    if (m.status().code() != ckptio::Code::kDataLoss) fail("rejection is not kDataLoss", m.status().to_string());
    return 0;
  }
  if (m->attempt.empty() || m->attempt.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("accepted a bad attempt", m->attempt);
  if (m->process_count < 1 || m->process_index < 0 || m->process_index >= m->process_count)
    fail("accepted a bad process index", std::to_string(m->process_index));
  for (const auto& p : m->index.prefixes)
    for (const auto& leaf : p.leaves) {
      for (size_t i = 0; i < leaf.shards.size(); ++i) {
        const auto& s = leaf.shards[i];
        for (size_t d = 0; d < leaf.shape.size(); ++d)
          if (s.box.start[d] < 0 || s.box.start[d] > s.box.stop[d] || s.box.stop[d] > leaf.shape[d])
            fail("accepted a box outside its leaf", leaf.path);
        for (size_t j = 0; j < i && leaf.shards.size() < 256; ++j)
          if (overlap(s.box, leaf.shards[j].box) && ckptio::checked_num_bytes(s.box.extent()).value_or(0) > 0)
            fail("accepted overlapping shards", leaf.path);
      }
    }
  auto back = ckptio::parse_manifest(ckptio::serialize_manifest(*m));
  if (!back.ok()) fail("round trip fails to parse", back.status().to_string());
  if (back->attempt != m->attempt || back->process_index != m->process_index ||
      back->process_count != m->process_count || back->error != m->error ||
      !(back->index.prefixes == m->index.prefixes) || !(back->index.files == m->index.files))
    fail("round trip changed the manifest", m->attempt);
  if (m->error) return 0;
  ckptio::Manifest other = *m;
  other.process_index = m->process_index == 0 ? 1 : 0;
  auto merged = ckptio::merge_manifests({*m, other});
  if (merged.ok()) {
    auto idx = ckptio::parse_index(ckptio::serialize_index(*merged));
    if (!idx.ok()) fail("merged index does not parse", idx.status().to_string());
  } else if (merged.status().code() != ckptio::Code::kFailedPrecondition) {
    fail("merge failure is not kFailedPrecondition", merged.status().to_string());
  }
  return 0;
}
