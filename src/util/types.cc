#include "ckptio/types.h"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include <sys/mman.h>

#include "src/util/allocate.h"

namespace ckptio {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, kNumDTypes> kDTypes{{
    {DType::kBool, "bool", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUInt8, "uint8", 1},
    {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},
    {DType::kUInt64, "uint64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
    {DType::kComplex64, "complex64", 8},
    {DType::kComplex128, "complex128", 16},
}};

}  // namespace

std::string_view dtype_name(DType t) { return kDTypes[static_cast<size_t>(t)].name; }
size_t dtype_size(DType t) { return kDTypes[static_cast<size_t>(t)].size; }
size_t dtype_alignment(DType t) { return dtype_size(t); }

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& d : kDTypes)
    if (d.name == s) return d.type;
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 ||
         t == DType::kFloat64;
}

Box Box::whole(const Shape& shape) {
  Box b;
  b.start.assign(shape.size(), 0);
  b.stop = shape;
  return b;
}

Shape Box::extent() const {
  Shape e(start.size());
  for (size_t i = 0; i < start.size(); ++i) e[i] = stop[i] - start[i];
  return e;
}

bool Box::is_whole(const Shape& shape) const {
  if (start.size() != shape.size() || stop.size() != shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i)
    if (start[i] != 0 || stop[i] != shape[i]) return false;
  return true;
}

std::optional<uint64_t> checked_num_bytes(const Box& box, size_t itemsize) {
  if (box.stop.size() != box.start.size()) return std::nullopt;
  uint64_t n = itemsize;
  for (size_t i = 0; i < box.start.size(); ++i) {
    int64_t d;
    if (__builtin_sub_overflow(box.stop[i], box.start[i], &d) || d < 0) return std::nullopt;
    uint64_t r;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &r)) return std::nullopt;
    n = r;
  }
  return n;
}

std::optional<uint64_t> checked_num_bytes(const Shape& shape, size_t itemsize) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    uint64_t r;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &r)) return std::nullopt;
    n = r;
  }
  return n;
}

std::string shape_to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

LeafView LeafView::full(std::string prefix, std::string path, DType dtype, Shape shape,
                        const void* data) {
  LeafView v;
  v.prefix = std::move(prefix);
  v.path = std::move(path);
  v.dtype = dtype;
  v.shards.push_back(ShardView{Box::whole(shape), data});
  v.shape = std::move(shape);
  return v;
}

uint64_t LeafView::num_bytes() const {
  return checked_num_bytes(shape, dtype_size(dtype)).value_or(0);
}

namespace {

// Buffers of this size and up are mapped, not taken from malloc: glibc
// raises its mmap threshold to the size of each mapped block freed (up to
// 32 MiB), after which it serves such sizes from its heaps and keeps them
// when they are freed, one heap per thread that allocates. A conversion
// bounded to 512 MiB of buffers peaked at 1.19 GB of anonymous memory that
// way, 649 MB with the threshold held (docs/benchmarks/history.md, "A
// conversion from the device kept its memory bound only on paper").
constexpr size_t kMapAtLeast = 1 << 20;
constexpr size_t kPageSize = 4096;

}  // namespace

std::byte* map_aligned(size_t total, size_t alignment, size_t* mapped) {
  const size_t extra = alignment > kPageSize ? alignment - kPageSize : 0;
  const size_t len = (total + kPageSize - 1) / kPageSize * kPageSize;
  if (len + extra < len) return nullptr;
  void* m = ::mmap(nullptr, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const uintptr_t at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (at + alignment - 1) / alignment * alignment;
  if (aligned > at) ::munmap(m, aligned - at);
  if (const uintptr_t end = at + len + extra, used = aligned + len; end > used)
    ::munmap(reinterpret_cast<void*>(used), end - used);
  *mapped = len;
  return reinterpret_cast<std::byte*>(aligned);
}

Buffer Buffer::allocate(size_t size, size_t alignment, size_t phase) {
  if (alignment < 64) alignment = 64;
  phase &= alignment - 1;
  size_t total = size + phase;
  total = (total + alignment - 1) / alignment * alignment;
  if (total == 0) total = alignment;
  // No MADV_HUGEPAGE here: measured, it made restores into fresh memory
  // slower on a VM whose host backs idle memory lazily (0.45x with every
  // restore started alike: zeroing a huge page makes the host back 2 MiB at
  // once), and peak RSS 6% larger (docs/restart.md, "Where the 2 GiB
  // restart's time goes").
  Buffer b;
  size_t mapped = 0;
  if (std::byte* m = total >= kMapAtLeast ? map_aligned(total, alignment, &mapped) : nullptr) {
    b.base_ = std::shared_ptr<std::byte>(m, [mapped](std::byte* q) { ::munmap(q, mapped); });
  } else {
    void* p = std::aligned_alloc(alignment, total);
    if (!p) throw std::bad_alloc();
    b.base_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
  }
  b.data_ = b.base_.get() + phase;
  b.size_ = size;
  return b;
}

}  // namespace ckptio

namespace ckptio {

Buffer Buffer::slice(size_t offset, size_t size) const {
  if (offset > size_ || size > size_ - offset)
    throw std::out_of_range("Buffer::slice [" + std::to_string(offset) + ", +" + std::to_string(size) +
                            ") of " + std::to_string(size_) + " bytes");
  Buffer b;
  b.base_ = base_;
  b.data_ = data_ + offset;
  b.size_ = size;
  return b;
}

Buffer Buffer::wrap(void* data, size_t size) {
  Buffer b;
  b.data_ = static_cast<std::byte*>(data);
  b.size_ = size;
  return b;
}

}  // namespace ckptio
