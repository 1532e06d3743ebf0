// Micro-benchmarks of the CPU-bound pieces on the save and restore paths:
// checksums, index serialize/parse at scale, staging copies.
//   build/bin/micro_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "ckptio/index.h"
#include "src/crc32c.h"
#include "src/index_readers.h"

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
    LeafRecord l{"params.layers." + std::to_string(i) + ".mlp.kernel", DType::kBFloat16, {64, 32}, {}};
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

}  // namespace
}  // namespace ckptio

BENCHMARK_MAIN();
