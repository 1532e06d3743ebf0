#include "src/save/buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <sys/mman.h>

#include "src/util/allocate.h"
#include "src/util/populate.h"
#include "src/util/log.h"

namespace ckptio {

BufferPool::BufferPool(uint64_t chunk, uint64_t capacity)
    : chunk_(chunk), capacity_(std::max<uint64_t>(capacity, 1)), ceiling_(capacity_) {
  free_.reserve(capacity_);  // so that keeping a buffer never allocates
}

BufferPool::~BufferPool() {
  for (std::byte* b : free_) free_buffer(b);
}

std::byte* BufferPool::acquire() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !free_.empty() || allocated_ < ceiling_; });
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
    if (b) {
      populate(b);
      return b;
    }
    lock.lock();
    if (--allocated_ == 0) {
      cv_.notify_all();  // waiters try for themselves
      return nullptr;
    }
    std::vector<std::byte*> unmap;
    refused_locked(&unmap);  // then wait for one of the buffers there are
    if (!unmap.empty()) {
      lock.unlock();
      for (std::byte* u : unmap) free_buffer(u);
      lock.lock();
    }
  }
}

void BufferPool::refused_locked(std::vector<std::byte*>* unmap) {
  const uint64_t ceiling = allocated_ > 1 ? allocated_ - 1 : 1;
  if (ceiling < ceiling_)
    logging::warn("ckptio: the system refused a staging buffer of {} bytes; saves go on with {} of {}", chunk_,
                 ceiling, capacity_);
  ceiling_ = std::min(ceiling_, ceiling);
  while (allocated_ > ceiling_ && !free_.empty()) {
    unmap->push_back(free_.back());
    free_.pop_back();
    --allocated_;
  }
}

Status BufferPool::out_of_memory() const {
  return ckptio::out_of_memory("a staging buffer of " + std::to_string(chunk_) +
                               " bytes (the system refused it: RLIMIT_AS or overcommit; a smaller "
                               "staging_budget or chunk_size, or borrow staging, needs less)");
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
  size_t mapped = 0;
  std::byte* p = map_aligned(chunk_, align, &mapped);
  if (p && align == huge) (void)::madvise(p, chunk_, MADV_HUGEPAGE);
  return p;
}

void BufferPool::free_buffer(std::byte* b) const { ::munmap(b, chunk_); }

Status BufferPool::reserve(uint64_t n, bool lift) {
  uint64_t make = 0;
  {
    std::lock_guard lock(mu_);
    if (lift) ceiling_ = capacity_;
    n = std::min(n, ceiling_);
    if (allocated_ >= n) return Status::OK();
    make = n - allocated_;
    allocated_ = n;
  }
  // Both lists' room first: refused, the count goes back and nothing else
  // changed (refused_locked may move every free buffer to `unmap`).
  std::vector<std::byte*> made, unmap;
  try {
    made.reserve(make);
    unmap.reserve(capacity_);
  } catch (const std::bad_alloc&) {
    {
      std::lock_guard lock(mu_);
      allocated_ -= make;
    }
    cv_.notify_all();
    return ckptio::out_of_memory("the staging pool's list of " + std::to_string(make) + " buffers");
  }
  for (uint64_t i = 0; i < make; ++i) {
    std::byte* b = allocate_buffer();
    if (!b) break;
    populate(b);
    made.push_back(b);
  }
  {
    std::lock_guard lock(mu_);
    allocated_ -= make - made.size();
    free_.insert(free_.end(), made.begin(), made.end());
    if (made.size() < make && allocated_ > 0) refused_locked(&unmap);
  }
  for (std::byte* b : unmap) free_buffer(b);
  cv_.notify_all();
  return made.size() == make ? Status::OK() : out_of_memory();
}

void BufferPool::release(std::byte* buf) {
  {
    std::lock_guard lock(mu_);
    if (allocated_ <= ceiling_) {
      free_.push_back(buf);
      buf = nullptr;
    } else {
      --allocated_;  // above a ceiling a refusal lowered: back to the system
    }
  }
  if (buf) free_buffer(buf);
  cv_.notify_one();
}

}  // namespace ckptio
