// Micro-benchmarks of the CPU-bound pieces on the save and restore paths:
// checksums, index serialize/parse at scale, staging copies, and what a leaf
// costs a whole save or restore (many tiny leaves in the in-memory store, so
// that the bytes cost next to nothing).
//   build/bin/micro_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/manager.h"
#include "src/util/crc32c.h"
#include "src/index/index_readers.h"

namespace ckptio {
namespace {

void BM_Crc32c(benchmark::State& state) {
  std::vector<std::byte> buf(state.range(0), std::byte{7});
  for (auto _ : state) benchmark::DoNotOptimize(crc32c(buf.data(), buf.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Crc32c)->Arg(64 << 10)->Arg(8 << 20);

void BM_Memcpy(benchmark::State& state) {
  std::vector<std::byte> a(state.range(0), std::byte{1}), b(state.range(0));
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Memcpy)->Arg(8 << 20);

Index make_index(int leaves) {
  Index idx;
  idx.step = 1;
  idx.files.push_back({"data-0123456789abcdef-0.bin", 0});
  idx.prefixes.push_back({"model", {}});
  uint64_t off = 0;
  for (int i = 0; i < leaves; ++i) {
    LeafRecord l{"params.layers." + std::to_string(i) + ".mlp.kernel", DType::kBFloat16, {64, 32}, {}, {}};
    l.shards.push_back({Box::whole(l.shape), idx.files[0].name, off, 64 * 32 * 2, 12345});
    off += 64 * 32 * 2;
    idx.prefixes[0].leaves.push_back(std::move(l));
  }
  idx.files[0].size = off;
  return idx;
}

void BM_IndexSerialize(benchmark::State& state) {
  Index idx = make_index(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(serialize_index(idx));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_IndexSerialize)->Arg(100)->Arg(100000)->Unit(benchmark::kMillisecond);

// save()'s check of the caller's metadata, on the caller's thread: shaped as
// the Python package's (a tree of `leaves` dotted key paths, ~13.5 KB for 295).
void BM_CheckMetadataJson(benchmark::State& state) {
  std::string json = R"({"synth":{"seed":0},"ckptio.python_tree":{"version":1,"prefix":null,"nodes":[["d",["model","tx"]],["d",[)";
  for (int i = 0; i < state.range(0); ++i)
    json += (i ? ",\"" : "\"") + std::string("params.layers.") + std::to_string(i) + ".attn.q_proj.kernel\"";
  json += "]]]}}";
  for (auto _ : state) benchmark::DoNotOptimize(check_metadata_json(json));
  state.SetBytesProcessed(state.iterations() * json.size());
}
BENCHMARK(BM_CheckMetadataJson)->Arg(295)->Unit(benchmark::kMicrosecond);

void BM_IndexParse(benchmark::State& state) {
  std::string json = serialize_index(make_index(state.range(0)));
  for (auto _ : state) {
    auto r = parse_index(json);
    if (!r.ok()) state.SkipWithError(r.status().to_string().c_str());
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * json.size());
}
BENCHMARK(BM_IndexParse)->Arg(100)->Arg(100000)->Unit(benchmark::kMillisecond);

// The strict reader alone: what parse_index costs for an index the fast
// reader leaves to it (docs/format.md 3.3).
void BM_IndexParseStrict(benchmark::State& state) {
  std::string json = serialize_index(make_index(state.range(0)));
  for (auto _ : state) {
    auto r = index_readers::read_index_strict(json);
    if (!r.ok()) state.SkipWithError(r.status().to_string().c_str());
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * json.size());
}
BENCHMARK(BM_IndexParseStrict)->Arg(100000)->Unit(benchmark::kMillisecond);

// A state of `leaves` leaves of 64 bytes (bfloat16 [4, 8]) under "model".
struct TinyState {
  std::vector<std::byte> bytes;
  std::vector<LeafView> views;
  explicit TinyState(int leaves) : bytes(static_cast<size_t>(leaves) * 64, std::byte{3}) {
    for (int i = 0; i < leaves; ++i)
      views.push_back(LeafView::full("model", "params.layers." + std::to_string(i) + ".mlp.kernel",
                                     DType::kBFloat16, {4, 8}, bytes.data() + 64 * static_cast<size_t>(i)));
  }
};

// A new in-memory store each call (the benchmark library calls a benchmark
// more than once, and a named store lives as long as the process).
std::unique_ptr<CheckpointManager> memory_manager(const std::string& name) {
  static int calls = 0;
  ManagerOptions o;
  o.staging = StagingMode::kBorrow;
  o.max_to_keep = 1;
  auto m = CheckpointManager::open("mem://" + name + "-" + std::to_string(++calls), o);
  if (!m.ok()) std::abort();
  return std::move(m).value();
}

// save() until committed: checking, planning, index, commit (its self-check
// parse included), per leaf.
void BM_SaveTinyLeaves(benchmark::State& state) {
  TinyState s(state.range(0));
  auto m = memory_manager("bm-save-" + std::to_string(state.range(0)));
  int64_t step = 0;
  for (auto _ : state) {
    auto h = m->save(++step, s.views);
    Status st = h.ok() ? h->wait() : h.status();
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SaveTinyLeaves)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

// save() alone: what the caller is blocked for (checking, row bands,
// planning, queueing), the state handed over as a moved vector as a trainer
// would; the save itself is waited for outside the timing.
void BM_SaveStallTinyLeaves(benchmark::State& state) {
  TinyState s(state.range(0));
  auto m = memory_manager("bm-stall-" + std::to_string(state.range(0)));
  int64_t step = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<LeafView> views = s.views;
    state.ResumeTiming();
    auto h = m->save(++step, std::move(views));
    state.PauseTiming();
    Status st = h.ok() ? h->wait() : h.status();
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SaveStallTinyLeaves)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

// restore(step) into fresh memory, the result destroyed: index read and
// parse, planning, reads, checksums, per leaf.
void BM_RestoreTinyLeaves(benchmark::State& state) {
  TinyState s(state.range(0));
  auto m = memory_manager("bm-restore-" + std::to_string(state.range(0)));  // keeps the one step
  auto h = m->save(1, s.views);
  Status st = h.ok() ? h->wait() : h.status();
  if (!st.ok()) return state.SkipWithError(st.to_string().c_str());
  for (auto _ : state) {
    auto r = m->restore(1);
    if (!r.ok()) state.SkipWithError(r.status().to_string().c_str());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_RestoreTinyLeaves)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ckptio

BENCHMARK_MAIN();
