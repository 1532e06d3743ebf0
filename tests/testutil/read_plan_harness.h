// Test harness for the read planner, shared by tests/read_planner_test.cc and
// fuzz/read_planner_fuzz.cc (so no GoogleTest here): saves a global array
// whose every byte is a known function of its position into in-memory
// "files" under any set of boxes, executes a ReadPlan against them the way a
// restore would, and checks the plan's promises independently of the
// planner (by brute force on small arrays).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/util/box_runs.h"
#include "src/util/crc32c.h"
#include "src/restore/read_planner.h"

namespace ckptio::testing {

// Byte j of global element i (C-order flat index).
inline std::byte value_byte(uint64_t i, size_t j) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + (j + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return static_cast<std::byte>(x >> 56);
}

inline uint64_t flat_index(const Shape& shape, const std::vector<int64_t>& idx) {
  uint64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * static_cast<uint64_t>(shape[d]) + idx[d];
  return f;
}

// Calls f(global index vector) for each element of `box` in C order.
template <typename F>
void for_each_element(const Box& box, F&& f) {
  if (box_is_empty(box)) return;
  std::vector<int64_t> idx = box.start;
  for (;;) {
    f(idx);
    size_t d = box.rank();
    while (d > 0) {
      --d;
      if (++idx[d] < box.stop[d]) break;
      idx[d] = box.start[d];
      if (d == 0) return;
    }
    if (box.rank() == 0) return;
  }
}

// The C-order bytes of `box` of the global array.
inline std::vector<std::byte> box_bytes(const Shape& shape, size_t elem, const Box& box) {
  std::vector<std::byte> out;
  for_each_element(box, [&](const std::vector<int64_t>& idx) {
    const uint64_t i = flat_index(shape, idx);
    for (size_t j = 0; j < elem; ++j) out.push_back(value_byte(i, j));
  });
  return out;
}

struct SavedArray {
  SavedLeaf leaf;
  std::vector<std::vector<std::byte>> files;
};

// Lays `boxes` out over `num_files` files in a shuffled order, with up to
// `max_padding` garbage bytes before each piece (alignment gaps).
inline SavedArray save_boxes(const Shape& shape, size_t elem, const std::vector<Box>& boxes,
                             uint32_t num_files, uint64_t max_padding, std::mt19937_64& rng) {
  SavedArray s;
  s.leaf.shape = shape;
  s.leaf.element_size = elem;
  s.files.resize(std::max<uint32_t>(num_files, 1));
  std::vector<size_t> order(boxes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  s.leaf.pieces.resize(boxes.size());
  for (size_t i : order) {
    const uint32_t f = static_cast<uint32_t>(rng() % s.files.size());
    std::vector<std::byte>& file = s.files[f];
    const uint64_t pad = max_padding ? rng() % (max_padding + 1) : 0;
    file.insert(file.end(), pad, std::byte{0xEE});
    std::vector<std::byte> bytes = box_bytes(shape, elem, boxes[i]);
    SavedPiece& p = s.leaf.pieces[i];
    p.box = boxes[i];
    p.file = f;
    p.offset = file.size();
    p.length = bytes.size();
    p.crc32c = crc32c(bytes.data(), bytes.size());
    file.insert(file.end(), bytes.begin(), bytes.end());
  }
  return s;
}

// A grid split of `shape`: cuts[d] are sorted interior cut points of
// dimension d (repeats give empty boxes).
inline std::vector<Box> grid_boxes(const Shape& shape, const std::vector<std::vector<int64_t>>& cuts) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> parts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t at = 0;
    for (int64_t c : cuts[d]) parts[d].push_back({at, c}), at = c;
    parts[d].push_back({at, shape[d]});
  }
  std::vector<Box> out;
  std::vector<size_t> idx(shape.size(), 0);
  for (;;) {
    Box b;
    for (size_t d = 0; d < shape.size(); ++d) {
      b.start.push_back(parts[d][idx[d]].first);
      b.stop.push_back(parts[d][idx[d]].second);
    }
    out.push_back(b);
    size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++idx[d] < parts[d].size()) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (shape.empty()) return out;
  }
}

// Executes `plan` over `saved` into fresh target buffers and checks every
// promise of read_planner.h. Returns "" or what went wrong. `out` receives
// the target buffers.
inline std::string check_plan(const ReadPlan& plan, const SavedArray& saved,
                              const std::vector<Box>& targets, const PlanOptions& o,
                              std::vector<std::vector<std::byte>>* out = nullptr) {
  const SavedLeaf& leaf = saved.leaf;
  const size_t elem = leaf.element_size;
  auto fail = [](const std::string& s) { return s; };
  if (plan.target_bytes.size() != targets.size()) return fail("target_bytes size");
  std::vector<std::vector<std::byte>> buf(targets.size());
  std::vector<std::vector<uint8_t>> writes(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    if (plan.target_bytes[t] != *box_elements(targets[t]) * elem) return fail("target_bytes value");
    buf[t].assign(plan.target_bytes[t], std::byte{0x5A});
    writes[t].assign(plan.target_bytes[t], 0);
  }
  // Reads: sorted, disjoint, bounded, inside their files.
  std::vector<std::vector<uint8_t>> file_read(saved.files.size());
  for (size_t f = 0; f < saved.files.size(); ++f) file_read[f].assign(saved.files[f].size(), 0);
  uint64_t bytes_read = 0, staging_end = 0, direct = 0, copied = 0;
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    const PlannedRead& r = plan.reads[i];
    if (r.length == 0) return fail("empty read " + std::to_string(i));
    if (r.length > std::max<uint64_t>(o.max_read, 1)) return fail("read longer than max_read");
    if (r.file >= saved.files.size() || r.offset > saved.files[r.file].size() ||
        r.length > saved.files[r.file].size() - r.offset)
      return fail("read outside its file");
    if (i > 0) {
      const PlannedRead& p = plan.reads[i - 1];
      if (p.file > r.file || (p.file == r.file && p.offset + p.length > r.offset))
        return fail("reads not sorted or overlapping at " + std::to_string(i));
    }
    for (uint64_t b = r.offset; b < r.offset + r.length; ++b)
      if (file_read[r.file][b]++) return fail("byte requested twice");
    bytes_read += r.length;
  }
  if (bytes_read != plan.stats.bytes_read || plan.reads.size() != plan.stats.requests)
    return fail("stats.bytes_read / requests");
  // Execute: land each read, then its copies.
  std::vector<std::byte> staging(plan.staging_bytes);
  uint32_t next_copy = 0;
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    const PlannedRead& r = plan.reads[i];
    const std::byte* src = saved.files[r.file].data() + r.offset;
    std::byte* landed;
    if (r.target == kStaging) {
      if (r.dst_offset != staging_end) return fail("staging offsets not packed");
      staging_end += r.length;
      if (staging_end > staging.size()) return fail("staging overflow");
      landed = staging.data() + r.dst_offset;
    } else {
      if (r.target >= targets.size() || r.dst_offset > buf[r.target].size() ||
          r.length > buf[r.target].size() - r.dst_offset)
        return fail("direct read outside its target");
      landed = buf[r.target].data() + r.dst_offset;
      for (uint64_t b = 0; b < r.length; ++b) writes[r.target][r.dst_offset + b]++;
      direct += r.length;
    }
    std::memcpy(landed, src, r.length);
    if (r.first_copy != next_copy) return fail("copies not grouped by read");
    next_copy += r.num_copies;
    for (uint32_t c = r.first_copy; c < r.first_copy + r.num_copies; ++c) {
      const PlannedCopy& cp = plan.copies[c];
      if (cp.read != i || cp.target >= targets.size() || cp.run_bytes == 0 ||
          cp.first_dim + cp.num_dims > plan.copy_dims.size())
        return fail("malformed copy " + std::to_string(c));
      std::string err;
      for_each_copy_run(plan, cp, [&](uint64_t s, uint64_t d, uint64_t n) {
        if (!err.empty()) return;
        if (s > r.length || n > r.length - s) err = "copy reads outside its read";
        else if (d > buf[cp.target].size() || n > buf[cp.target].size() - d) err = "copy writes outside its target";
        else
          for (uint64_t b = 0; b < n; ++b) writes[cp.target][d + b]++;
        copied += n;
      });
      if (!err.empty()) return fail(err);
    }
    std::vector<std::byte*> ptrs;
    for (auto& b : buf) ptrs.push_back(b.data());
    apply_copies(plan, i, landed, ptrs);
  }
  if (next_copy != plan.copies.size()) return fail("copies not all owned by reads");
  if (staging_end != plan.staging_bytes) return fail("staging_bytes");
  if (direct != plan.stats.bytes_direct || copied != plan.stats.bytes_copied) return fail("stats direct/copied");
  // Every target byte written once, with the right value.
  uint64_t delivered = 0;
  for (size_t t = 0; t < targets.size(); ++t) {
    for (uint8_t w : writes[t])
      if (w != 1) return fail("target " + std::to_string(t) + " byte written " + std::to_string(w) + " times");
    if (buf[t] != box_bytes(leaf.shape, elem, targets[t])) return fail("target " + std::to_string(t) + " differs");
    delivered += buf[t].size();
  }
  if (delivered != plan.stats.bytes_delivered) return fail("stats.bytes_delivered");
  // bytes_needed: the union of the targets, by marking elements.
  const uint64_t global = checked_num_bytes(leaf.shape).value_or(0);
  std::vector<uint8_t> needed(global, 0);
  for (const Box& t : targets)
    for_each_element(t, [&](const std::vector<int64_t>& idx) { needed[flat_index(leaf.shape, idx)] = 1; });
  uint64_t distinct = 0;
  for (uint8_t n : needed) distinct += n;
  if (distinct * elem != plan.stats.bytes_needed) return fail("stats.bytes_needed");
  if (plan.stats.bytes_read < plan.stats.bytes_needed) return fail("read fewer bytes than needed");
  // Pieces: needed / verifiable exactly as the reads say, checksums hold.
  if (plan.pieces.size() != leaf.pieces.size()) return fail("pieces size");
  for (size_t p = 0; p < leaf.pieces.size(); ++p) {
    const SavedPiece& piece = leaf.pieces[p];
    bool is_needed = false;
    for (const Box& t : targets) is_needed |= !box_is_empty(piece.box) && intersect(piece.box, t).has_value();
    if (plan.pieces[p].needed != is_needed) return fail("piece " + std::to_string(p) + " needed flag");
    if (!is_needed) continue;
    bool whole = true;
    for (uint64_t b = piece.offset; b < piece.offset + piece.length; ++b) whole &= file_read[piece.file][b] != 0;
    if (plan.pieces[p].verifiable != (whole && piece.crc32c.has_value()))
      return fail("piece " + std::to_string(p) + " verifiable flag");
    if (o.verify && piece.crc32c && piece.length <= o.verify_widen_max_bytes && !whole)
      return fail("piece " + std::to_string(p) + " small enough to widen but not read whole");
    if (plan.pieces[p].verifiable) {
      uint32_t crc = 0;
      uint64_t covered = 0;
      for_each_piece_slice(plan, leaf, p, [&](size_t read, uint64_t off, uint64_t len) {
        const PlannedRead& r = plan.reads[read];
        crc = crc32c(saved.files[r.file].data() + r.offset + off, len, crc);
        covered += len;
      });
      if (covered != piece.length || crc != *piece.crc32c) return fail("piece " + std::to_string(p) + " checksum");
    }
  }
  if (out) *out = std::move(buf);
  return "";
}

}  // namespace ckptio::testing
