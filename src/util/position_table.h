// Positions in a sequence found by a key of strings, for the checks and
// look-ups that run once per leaf: an open-addressing table of positions,
// one allocation in all instead of one per entry (a state or an index may
// hold millions of leaves).
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

namespace ckptio {

class PositionTable {
 public:
  // Room for up to `n` entries (the table stays at most half full).
  explicit PositionTable(size_t n) {
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    slots_.assign(slots, 0);
  }

  // The slot of a key whose hash is `hash`: position + 1 of the entry for
  // which is_key(position) holds, or 0, an empty slot, where to put it.
  template <class IsKey>
  size_t& slot(size_t hash, IsKey&& is_key) {
    const size_t mask = slots_.size() - 1;
    for (size_t at = hash & mask;; at = (at + 1) & mask)
      if (slots_[at] == 0 || is_key(slots_[at] - 1)) return slots_[at];
  }

 private:
  std::vector<size_t> slots_;
};

inline size_t hash_names(std::string_view a, std::string_view b = {}) {
  const std::hash<std::string_view> h;
  return h(a) * 31 + h(b);
}

}  // namespace ckptio
