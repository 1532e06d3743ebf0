#include "tools/cli/synth.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <functional>
#include <thread>

#include <sys/mman.h>

namespace ckptio::synth {
namespace {

static_assert(std::endian::native == std::endian::little,
              "splitmix64-v1 defines bytes as little-endian words");

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kGolden2 = 0xD1B54A32D192ED03ull;
constexpr uint64_t kTaskBytes = 8ull << 20;  // unit of parallel work

inline uint64_t word(uint64_t key, uint64_t w) { return splitmix64_mix(key + (w + 1) * kGolden); }

// A leaf's dimensions in terms of the model width d and the vocabulary V.
enum class Dim : uint8_t { kD, kD4, kV };

struct Proto {
  std::string prefix;
  std::string path;
  DType dtype;
  std::vector<Dim> dims;
};

Proto param(uint64_t j, uint64_t m) {
  if (j == 0) return {"model", "params.embed.embedding", DType::kBFloat16, {Dim::kV, Dim::kD}};
  if (m >= 2 && j == m - 1) return {"model", "params.final_norm.scale", DType::kFloat32, {Dim::kD}};
  const uint64_t layer = (j - 1) / 8;
  const std::string base = "params.layers." + std::to_string(layer) + ".";
  switch ((j - 1) % 8) {
    case 0: return {"model", base + "attn.q_proj.kernel", DType::kBFloat16, {Dim::kD, Dim::kD}};
    case 1: return {"model", base + "attn.k_proj.kernel", DType::kBFloat16, {Dim::kD, Dim::kD}};
    case 2: return {"model", base + "attn.v_proj.kernel", DType::kBFloat16, {Dim::kD, Dim::kD}};
    case 3: return {"model", base + "attn.o_proj.kernel", DType::kBFloat16, {Dim::kD, Dim::kD}};
    case 4: return {"model", base + "mlp.up.kernel", DType::kBFloat16, {Dim::kD, Dim::kD4}};
    case 5: return {"model", base + "mlp.down.kernel", DType::kBFloat16, {Dim::kD4, Dim::kD}};
    case 6: return {"model", base + "attn_norm.scale", DType::kFloat32, {Dim::kD}};
    default: return {"model", base + "mlp_norm.scale", DType::kFloat32, {Dim::kD}};
  }
}

std::vector<Proto> protos(uint64_t n) {
  n = std::clamp<uint64_t>(n, 1, kMaxLeaves);
  uint64_t m = 1, mu = 0, nu = 0;
  bool count = false;
  if (n >= 2) {
    count = true;
    const uint64_t rest = n - 1;
    m = (rest + 2) / 3;
    mu = std::min(m, rest - m);
    nu = rest - m - mu;
  }
  std::vector<Proto> out;
  out.reserve(n);
  for (uint64_t j = 0; j < m; ++j) out.push_back(param(j, m));
  if (count) out.push_back({"tx", "opt_state.count", DType::kInt32, {}});
  for (const char* moment : {"mu", "nu"}) {
    const uint64_t k = moment[0] == 'm' ? mu : nu;
    for (uint64_t j = 0; j < k; ++j) {
      Proto p = out[j];
      p.prefix = "tx";
      p.path = std::string("opt_state.") + moment + "." + p.path.substr(std::strlen("params."));
      p.dtype = DType::kFloat32;
      out.push_back(std::move(p));
    }
  }
  return out;
}

using u128 = unsigned __int128;

// bytes(d, V) = a2 * d^2 + av * V * d + a1 * d + a0
struct Coeffs {
  u128 a2 = 0, av = 0, a1 = 0, a0 = 0;
  u128 bytes(u128 d, u128 v) const { return a2 * d * d + av * v * d + a1 * d + a0; }
};

Coeffs coefficients(const std::vector<Proto>& ps) {
  Coeffs c;
  for (const Proto& p : ps) {
    const u128 item = dtype_size(p.dtype);
    int nd = 0, nd4 = 0, nv = 0;
    for (Dim x : p.dims) (x == Dim::kD ? nd : x == Dim::kD4 ? nd4 : nv)++;
    if (p.dims.empty()) c.a0 += item;
    else if (nv == 1 && nd == 1) c.av += item;
    else if (nd + nd4 == 2) c.a2 += item * (nd4 ? 4 : 1);
    else c.a1 += item;
  }
  return c;
}

}  // namespace

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(std::string_view s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t leaf_key(uint64_t seed, std::string_view prefix, std::string_view path, uint64_t version) {
  uint64_t h = fnv1a64(path, fnv1a64("/", fnv1a64(prefix)));
  return splitmix64_mix(h ^ splitmix64_mix(seed + kGolden) ^ splitmix64_mix(version * kGolden2));
}

Layout make_layout(uint64_t target_bytes, uint64_t num_leaves) {
  const std::vector<Proto> ps = protos(num_leaves);
  const Coeffs c = coefficients(ps);
  const u128 budget = target_bytes;
  // Largest d with bytes(d, 8d) <= budget (bytes grows with d).
  uint64_t lo = 0, hi = 1ull << 32;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (c.bytes(mid, u128(8) * mid) <= budget) lo = mid;
    else hi = mid - 1;
  }
  Layout out;
  out.d = static_cast<int64_t>(lo);
  u128 vocab = u128(8) * lo;
  const u128 base = c.bytes(lo, vocab);
  const u128 per_row = c.av * lo;
  if (base <= budget && per_row > 0) vocab += (budget - base) / per_row;
  out.vocab = static_cast<int64_t>(vocab);
  out.layers = 0;
  out.leaves.reserve(ps.size());
  for (const Proto& p : ps) {
    SynthLeaf leaf;
    leaf.prefix = p.prefix;
    leaf.path = p.path;
    leaf.dtype = p.dtype;
    for (Dim x : p.dims)
      leaf.shape.push_back(x == Dim::kD ? out.d : x == Dim::kD4 ? 4 * out.d : out.vocab);
    leaf.bytes = checked_num_bytes(leaf.shape, dtype_size(leaf.dtype)).value_or(0);
    out.total_bytes += leaf.bytes;
    if (p.prefix == "model" && p.path.rfind("params.layers.", 0) == 0) {
      const int64_t layer = std::stoll(p.path.substr(std::strlen("params.layers.")));
      out.layers = std::max(out.layers, layer + 1);
    }
    out.leaves.push_back(std::move(leaf));
  }
  return out;
}

void fill(uint64_t key, uint64_t byte_offset, std::byte* dst, size_t n) {
  uint64_t w = byte_offset / 8;
  const unsigned r = byte_offset % 8;
  if (r != 0 && n > 0) {
    const uint64_t v = word(key, w++);
    const size_t take = std::min<size_t>(8 - r, n);
    std::memcpy(dst, reinterpret_cast<const char*>(&v) + r, take);
    dst += take;
    n -= take;
  }
  for (; n >= 8; n -= 8, dst += 8) {
    const uint64_t v = word(key, w++);
    std::memcpy(dst, &v, 8);
  }
  if (n > 0) {
    const uint64_t v = word(key, w);
    std::memcpy(dst, &v, n);
  }
}

std::optional<uint64_t> find_mismatch(uint64_t key, uint64_t byte_offset, const std::byte* data,
                                      size_t n) {
  auto locate = [&](uint64_t at, const std::byte* p, size_t len) -> std::optional<uint64_t> {
    std::byte expect[8];
    fill(key, at, expect, len);
    for (size_t i = 0; i < len; ++i)
      if (p[i] != expect[i]) return at + i;
    return std::nullopt;
  };
  uint64_t at = byte_offset;
  const std::byte* p = data;
  size_t left = n;
  if (at % 8 != 0 && left > 0) {
    const size_t take = std::min<size_t>(8 - at % 8, left);
    if (auto m = locate(at, p, take)) return m;
    at += take, p += take, left -= take;
  }
  uint64_t w = at / 8;
  for (; left >= 8; left -= 8, p += 8, at += 8, ++w) {
    uint64_t got;
    std::memcpy(&got, p, 8);
    if (got != word(key, w)) return locate(at, p, 8);
  }
  if (left > 0) return locate(at, p, left);
  return std::nullopt;
}

void parallel_for(size_t n, unsigned threads, const std::function<void(size_t)>& fn) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, n));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

namespace {

struct Task {
  size_t leaf;
  uint64_t offset;
  uint64_t length;
};

std::vector<Task> split(const Layout& layout) {
  std::vector<Task> tasks;
  for (size_t i = 0; i < layout.leaves.size(); ++i) {
    const uint64_t bytes = layout.leaves[i].bytes;
    for (uint64_t at = 0; at < bytes; at += kTaskBytes)
      tasks.push_back({i, at, std::min(kTaskBytes, bytes - at)});
  }
  return tasks;
}

}  // namespace

std::vector<LeafView> State::views() const {
  std::vector<LeafView> out;
  out.reserve(layout.leaves.size());
  for (size_t i = 0; i < layout.leaves.size(); ++i) {
    const SynthLeaf& l = layout.leaves[i];
    out.push_back(LeafView::full(l.prefix, l.path, l.dtype, l.shape, data[i]));
  }
  return out;
}

void State::update_leaf(size_t i, uint64_t version) {
  const SynthLeaf& l = layout.leaves[i];
  versions[i] = version;
  fill(leaf_key(seed, l.prefix, l.path, version), 0, data[i], l.bytes);
}

State generate(Layout layout, uint64_t seed, unsigned threads) {
  State s;
  s.layout = std::move(layout);
  s.seed = seed;
  s.versions.assign(s.layout.leaves.size(), 0);
  // Leaves at 64-byte offsets, 4 KiB for the larger ones.
  std::vector<uint64_t> offsets;
  offsets.reserve(s.layout.leaves.size());
  uint64_t size = 0;
  for (const SynthLeaf& l : s.layout.leaves) {
    const uint64_t align = l.bytes >= (64u << 10) ? 4096 : 64;
    size = (size + align - 1) / align * align;
    offsets.push_back(size);
    size += l.bytes;
  }
  constexpr uint64_t kHuge = 2ull << 20;
  s.arena = Buffer::allocate(size, size >= kHuge ? kHuge : 4096);
  if (size >= kHuge) {
    // Huge pages, faulted in by the kernel in one call: measured on this
    // project's VM, touching 1 GiB of fresh 4 KiB pages took 5 s, huge pages
    // touched by memset 0.2-3 s, huge pages populated up front 0.15 s.
    // Both are hints; failures (old kernels) are harmless.
    const size_t span = (size + kHuge - 1) / kHuge * kHuge;  // inside the allocation
#ifdef MADV_HUGEPAGE
    ::madvise(s.arena.data(), span, MADV_HUGEPAGE);
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
    ::madvise(s.arena.data(), span, MADV_POPULATE_WRITE);
  }
  std::vector<uint64_t> keys;
  keys.reserve(s.layout.leaves.size());
  s.data.reserve(s.layout.leaves.size());
  for (size_t i = 0; i < s.layout.leaves.size(); ++i) {
    const SynthLeaf& l = s.layout.leaves[i];
    s.data.push_back(s.arena.data() + offsets[i]);
    keys.push_back(leaf_key(seed, l.prefix, l.path));
  }
  const std::vector<Task> tasks = split(s.layout);
  parallel_for(tasks.size(), threads, [&](size_t t) {
    const Task& k = tasks[t];
    fill(keys[k.leaf], k.offset, s.data[k.leaf] + k.offset, k.length);
  });
  return s;
}

std::optional<Mismatch> compare(const Layout& layout, uint64_t seed,
                                const std::vector<uint64_t>& versions,
                                const std::vector<const std::byte*>& data, unsigned threads) {
  std::vector<uint64_t> keys;
  keys.reserve(layout.leaves.size());
  for (size_t i = 0; i < layout.leaves.size(); ++i) {
    const SynthLeaf& l = layout.leaves[i];
    keys.push_back(leaf_key(seed, l.prefix, l.path, i < versions.size() ? versions[i] : 0));
  }
  const std::vector<Task> tasks = split(layout);
  // Tasks are in layout order; the first mismatching task wins. Tasks after
  // a known mismatch are skipped.
  std::atomic<size_t> first_bad{tasks.size()};
  std::vector<std::optional<uint64_t>> found(tasks.size());
  parallel_for(tasks.size(), threads, [&](size_t t) {
    if (t > first_bad.load(std::memory_order_relaxed)) return;
    const Task& k = tasks[t];
    found[t] = find_mismatch(keys[k.leaf], k.offset, data[k.leaf] + k.offset, k.length);
    if (found[t]) {
      size_t cur = first_bad.load();
      while (t < cur && !first_bad.compare_exchange_weak(cur, t)) {
      }
    }
  });
  const size_t t = first_bad.load();
  if (t == tasks.size()) return std::nullopt;
  return Mismatch{tasks[t].leaf, *found[t]};
}

}  // namespace ckptio::synth
