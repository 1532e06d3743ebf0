// RestoreOptions::into matched to the selected leaves (see destinations.h).
#include "src/restore/destinations.h"

#include "src/util/position_table.h"

namespace ckptio {

// The caller's destinations per selected leaf (a later one for the same
// leaf wins), refused before any read if one is of the wrong size. Usually
// the caller lists every selected leaf in the order the index does: then
// each destination is its leaf's, none repeats (the index's names are
// unique), and no table is needed.
Result<std::vector<const RestoreOptions::Destination*>> match_destinations(
    const std::vector<std::pair<std::string, LeafRecord*>>& selected,
    const std::vector<RestoreOptions::Destination>& into) {
  std::vector<const RestoreOptions::Destination*> dests(into.empty() ? 0 : selected.size());
  size_t wrong_size = SIZE_MAX;  // the first leaf whose destination is of the wrong size
  bool in_order = into.size() == selected.size();
  for (size_t i = 0; in_order && i < into.size(); ++i) {  // one pass over names and sizes
    const LeafRecord& leaf = *selected[i].second;
    in_order = into[i].path == leaf.path && into[i].prefix == selected[i].first;
    if (wrong_size == SIZE_MAX && into[i].size != leaf.num_bytes()) wrong_size = i;
    dests[i] = &into[i];
  }
  if (!in_order) {
    wrong_size = SIZE_MAX;
    PositionTable destinations(into.size());
    std::vector<bool> used(into.size(), false);
    for (size_t i = 0; i < into.size(); ++i)
      destinations.slot(hash_names(into[i].prefix, into[i].path), [&](size_t j) {
        return into[j].path == into[i].path && into[j].prefix == into[i].prefix;
      }) = i + 1;
    for (size_t i = 0; i < dests.size(); ++i) {
      const std::string& prefix = selected[i].first;  // (not a structured binding: clang 14 cannot capture one)
      const LeafRecord* leaf = selected[i].second;
      const size_t slot = destinations.slot(hash_names(prefix, leaf->path), [&](size_t j) {
        return into[j].path == leaf->path && into[j].prefix == prefix;
      });
      dests[i] = slot ? &into[slot - 1] : nullptr;
      if (wrong_size == SIZE_MAX && dests[i] && dests[i]->size != leaf->num_bytes()) wrong_size = i;
      if (slot) used[slot - 1] = true;
    }
    // A destination no selected leaf took (a misspelt name, a leaf of another
    // prefix or outside `select`) would leave the caller's memory as it was
    // while the restore succeeds: refused. An earlier entry for a leaf that a
    // later one took is not such a destination.
    for (size_t i = 0; i < into.size(); ++i) {
      if (used[i]) continue;
      const size_t last = destinations.slot(hash_names(into[i].prefix, into[i].path), [&](size_t j) {
        return into[j].path == into[i].path && into[j].prefix == into[i].prefix;
      });
      if (last && used[last - 1]) continue;
      return invalid_argument("restore destination for " + into[i].prefix + "/" + into[i].path +
                              " names no leaf this restore selected (" + std::to_string(selected.size()) +
                              " selected); its memory would be left as it is");
    }
  }
  if (wrong_size != SIZE_MAX) {
    const auto& [prefix, leaf] = selected[wrong_size];
    return invalid_argument("restore destination for " + prefix + "/" + leaf->path + " holds " +
                            std::to_string(dests[wrong_size]->size) + " bytes, the leaf has " +
                            std::to_string(leaf->num_bytes()));
  }
  return dests;
}

}  // namespace ckptio
