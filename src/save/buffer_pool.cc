#include "src/save/buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "src/util/populate.h"

namespace ckptio {

BufferPool::BufferPool(uint64_t chunk, uint64_t capacity)
    : chunk_(chunk), capacity_(std::max<uint64_t>(capacity, 1)) {}

BufferPool::~BufferPool() {
  for (std::byte* b : free_) ::munmap(b, chunk_);
}

std::byte* BufferPool::acquire() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty() || allocated_ < capacity_; });
  if (!free_.empty()) {
    std::byte* b = free_.back();
    free_.pop_back();
    return b;
  }
  ++allocated_;
  lock.unlock();
  // Faulted in whole now, as reserve() does: a buffer kept for later saves
  // must not take fresh page faults (and resident memory) save after save
  // as larger slices of it get used.
  std::byte* b = allocate_buffer();
  populate(b);
  return b;
}

void BufferPool::populate(std::byte* b) const {
  if (::madvise(b, chunk_, MADV_POPULATE_WRITE) != 0) std::memset(b, 0, chunk_);  // older kernels
}

std::byte* BufferPool::allocate_buffer() const {
  // Mapped, not malloc'd: buffers of megabytes belong to no heap, go back to
  // the system with the pool, and are always fresh pages, so that populate()
  // and prepare_staging() do what they say whatever malloc did before (a heap
  // could hand back memory an earlier user had already faulted in). 2 MiB-
  // aligned huge pages when the chunk allows: fewer page faults on the first
  // save and fewer TLB misses on every copy.
  const size_t huge = 2u << 20;
  const size_t align = chunk_ % huge == 0 ? huge : 4096;
  const size_t span = chunk_ + (align > 4096 ? align : 0);
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) std::abort();  // out of memory for a bounded, configured pool
  auto* base = static_cast<std::byte*>(m);
  auto* p = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(base) + align - 1) / align * align);
  if (p > base) ::munmap(base, static_cast<size_t>(p - base));  // the head and tail beyond the alignment
  if (base + span > p + chunk_) ::munmap(p + chunk_, static_cast<size_t>(base + span - (p + chunk_)));
  if (align == huge) (void)::madvise(p, chunk_, MADV_HUGEPAGE);
  return p;
}

void BufferPool::reserve(uint64_t n) {
  uint64_t make = 0;
  {
    std::lock_guard lock(mu_);
    n = std::min(n, capacity_);
    if (allocated_ >= n) return;
    make = n - allocated_;
    allocated_ = n;
  }
  std::vector<std::byte*> made;
  for (uint64_t i = 0; i < make; ++i) {
    std::byte* b = allocate_buffer();
    populate(b);
    made.push_back(b);
  }
  {
    std::lock_guard lock(mu_);
    free_.insert(free_.end(), made.begin(), made.end());
  }
  cv_.notify_all();
}

void BufferPool::release(std::byte* buf) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(buf);
  }
  cv_.notify_one();
}

}  // namespace ckptio
