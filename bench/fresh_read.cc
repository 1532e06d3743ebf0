// ckptio_fresh_read: the least a restart must do, and nothing else. Reads one
// file whole with O_DIRECT through io_uring (one ring, `--depth` requests of
// `--block` bytes in flight) into anonymous memory this process has never
// touched, while a thread faults that memory in from its end backwards
// (MADV_POPULATE_WRITE, 8 MiB at a time) until it meets the reads: the shape
// of ckptio's restore (src/restore/restore_whole.cc) without an index, a plan,
// checksums or leaves. bench/restart_bench.py runs it beside fio (whose reads
// reuse a few buffers and so touch no fresh memory) and ckptio's restart, to
// tell what this machine's fresh memory allows from what ckptio adds. It
// links nothing of ckptio on purpose: the faulting loop is that of
// populate_in_background (src/util/populate.cc) written again, without its
// nice 19, so that the reference stays what it is when ckptio changes.
//
//   ckptio_fresh_read FILE [--depth 32] [--block 8388608] [--no-prefault] [--touched]
//
// --touched faults the memory in before the clock starts (the reads alone);
// --no-prefault leaves the faulting to the reads. Prints one JSON line:
// {"bytes", "seconds", "gbps", "ready_monotonic_s", "verified"}, where
// "verified" says only that every byte of the file landed (nothing is checked).
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace {

// Exits at once: the faulting thread, if any, dies with the process.
[[noreturn]] void fail(const char* what, int err) {
  std::fprintf(stderr, "ckptio_fresh_read: %s: %s\n", what, std::strerror(err));
  std::_Exit(1);
}

double monotonic_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = nullptr;
  unsigned depth = 32;
  size_t block = 8u << 20;
  bool prefault = true, touched = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--depth" && i + 1 < argc) depth = std::strtoul(argv[++i], nullptr, 10);
    else if (a == "--block" && i + 1 < argc) block = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--no-prefault") prefault = false;
    else if (a == "--touched") touched = true;
    else if (!path && a[0] != '-') path = argv[i];
    else {
      std::fprintf(stderr, "usage: ckptio_fresh_read FILE [--depth N] [--block BYTES] [--no-prefault] [--touched]\n");
      return 2;
    }
  }
  if (!path || depth == 0 || block == 0 || block % 4096 != 0) {
    std::fprintf(stderr, "usage: ckptio_fresh_read FILE [--depth N] [--block BYTES (a multiple of 4096)] "
                         "[--no-prefault] [--touched]\n");
    return 2;
  }
  const int fd = open(path, O_RDONLY | O_DIRECT);
  if (fd < 0) fail(path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) fail("fstat", errno);
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t span = (size + 4095) / 4096 * 4096;  // O_DIRECT reads whole 4 KiB blocks; the last comes back short
  if (span == 0) fail(path, EINVAL);

  const double t0 = monotonic_s();
  auto* mem = static_cast<char*>(mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (mem == MAP_FAILED) fail("mmap", errno);
  double start = t0;
  if (touched) {
    if (madvise(mem, span, MADV_POPULATE_WRITE) != 0) fail("madvise", errno);
    start = monotonic_s();
  }
  std::atomic<size_t> front{0};
  std::thread faulting;
  if (prefault && !touched) {
    faulting = std::thread([&] {
      constexpr size_t kSlice = 8u << 20;
      size_t back = span;
      while (back > front.load(std::memory_order_relaxed) + kSlice) {
        back -= kSlice;
        if (madvise(mem + back, kSlice, MADV_POPULATE_WRITE) != 0) return;
      }
    });
  }
  io_uring ring;
  if (int r = io_uring_queue_init(depth, &ring, 0); r < 0) fail("io_uring_queue_init", -r);
  size_t submitted = 0, landed = 0;
  unsigned in_flight = 0;
  while (submitted < span || in_flight > 0) {
    while (in_flight < depth && submitted < span) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const size_t n = std::min(block, span - submitted);
      io_uring_prep_read(sqe, fd, mem + submitted, static_cast<unsigned>(n), submitted);
      submitted += n;
      ++in_flight;
      front.store(submitted, std::memory_order_relaxed);
    }
    if (int r = io_uring_submit_and_wait(&ring, 1); r < 0) fail("io_uring_submit", -r);
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      if (cqe->res < 0) fail("read", -cqe->res);
      landed += static_cast<size_t>(cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
    in_flight -= seen;
  }
  const double ready = monotonic_s();
  if (faulting.joinable()) faulting.join();
  const double seconds = ready - start;
  std::printf("{\"bytes\": %zu, \"seconds\": %.6f, \"gbps\": %.4f, \"ready_monotonic_s\": %.6f, \"verified\": %s}\n",
              size, seconds, size / seconds / 1e9, ready, landed == size ? "true" : "false");
  return landed == size ? 0 : 1;
}
