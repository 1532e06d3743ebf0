// Manifests of a multi-process save and their merge into a step's index.
#include "src/save/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <new>
#include <numeric>

#include "src/util/json_free.h"
#include "src/util/printable.h"

namespace ckptio {
namespace {

constexpr const char* kKey = "ckptio_manifest";

uint64_t volume(const Box& b) {
  uint64_t n = 1;
  for (size_t d = 0; d < b.rank(); ++d) n *= static_cast<uint64_t>(b.stop[d] - b.start[d]);
  return n;
}

std::optional<Box> intersect(const Box& x, const Box& y) {
  Box out = x;
  for (size_t d = 0; d < x.rank(); ++d) {
    out.start[d] = std::max(x.start[d], y.start[d]);
    out.stop[d] = std::min(x.stop[d], y.stop[d]);
    if (out.start[d] >= out.stop[d]) return std::nullopt;
  }
  return out;
}

// r minus b, as disjoint boxes (at most 2 per dimension).
void subtract(const Box& r, const Box& b, std::vector<Box>* out) {
  if (!intersect(r, b)) {
    out->push_back(r);
    return;
  }
  Box rest = r;  // the part of r still to split, narrowed dimension by dimension
  for (size_t d = 0; d < r.rank(); ++d) {
    if (rest.start[d] < b.start[d]) {
      Box low = rest;
      low.stop[d] = b.start[d];
      out->push_back(low);
      rest.start[d] = b.start[d];
    }
    if (rest.stop[d] > b.stop[d]) {
      Box high = rest;
      high.start[d] = b.stop[d];
      out->push_back(high);
      rest.stop[d] = b.stop[d];
    }
  }
}

std::string region(const Box& b) {
  if (b.rank() == 0) return "the scalar";
  std::string s = "elements [";
  for (size_t d = 0; d < b.rank(); ++d)
    s += (d ? ", " : "") + std::to_string(b.start[d]) + ":" + std::to_string(b.stop[d]);
  return s + "]";
}

}  // namespace

std::string manifest_name(const std::string& attempt, int process_index) {
  return manifest_prefix(attempt) + std::to_string(process_index) + ".json";
}
std::string manifest_prefix(const std::string& attempt) { return "manifest-" + attempt + "-p"; }
std::string failure_name(const std::string& attempt) { return "failed-" + attempt + ".json"; }

std::string serialize_manifest(const Manifest& m) {
  // Member by member, each container made whole before it is stored
  // (serialize_zarray says why).
  nlohmann::ordered_json meta = nlohmann::ordered_json::object(), mine = nlohmann::ordered_json::object();
  JsonFreer free_meta(meta), free_mine(mine);
  mine["attempt"] = m.attempt;
  mine["process_index"] = m.process_index;
  mine["process_count"] = m.process_count;
  mine["error"] = m.error ? nlohmann::ordered_json(*m.error) : nlohmann::ordered_json(nullptr);
  meta[kKey] = std::move(mine);
  Index index = m.index;
  // error_handler::replace: an error text from a backend may hold bytes that
  // are not UTF-8; the manifest must stay valid JSON.
  index.metadata_json = meta.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return serialize_index(index);
}

Result<Manifest> parse_manifest(std::string_view json) {
  IndexLimits limits;
  limits.partial_cover = true;
  auto index = parse_index(json, limits);
  if (!index.ok())  // (kResourceExhausted stays itself: not damage)
    return index.status().code() == Code::kResourceExhausted ? index.status().annotate("manifest")
                                                              : data_loss("manifest: " + index.status().message());
  Manifest m;
  try {
    // Canonical, depth- and size-checked text: safe to parse as a tree.
    nlohmann::json meta;
    JsonFreer free_meta(meta);
    parse_json_into(meta, index->metadata_json);
    auto it = meta.find(kKey);
    if (it == meta.end() || !it->is_object())
      return data_loss("manifest: metadata has no \"ckptio_manifest\" object");
    const auto& f = *it;
    auto need = [&](const char* name) -> const nlohmann::json* {
      auto at = f.find(name);
      return at == f.end() ? nullptr : &*at;
    };
    const auto* attempt = need("attempt");
    const auto* index_v = need("process_index");
    const auto* count_v = need("process_count");
    const auto* error = need("error");
    if (!attempt || !attempt->is_string() || attempt->get<std::string>().empty() ||
        attempt->get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      return data_loss("manifest: \"attempt\" must be a non-empty lowercase hex string");
    if (!count_v || !count_v->is_number_integer() || count_v->get<int64_t>() < 1 ||
        count_v->get<int64_t>() > kMaxGroupProcesses)
      return data_loss("manifest: \"process_count\" must be an integer in [1, 2^20]");
    if (!index_v || !index_v->is_number_integer() || index_v->get<int64_t>() < 0 ||
        index_v->get<int64_t>() >= count_v->get<int64_t>())
      return data_loss("manifest: \"process_index\" must be an integer in [0, process_count)");
    if (!error || !(error->is_null() || error->is_string()))
      return data_loss("manifest: \"error\" must be null or a string");
    m.attempt = attempt->get<std::string>();
    m.process_index = static_cast<int>(index_v->get<int64_t>());
    m.process_count = static_cast<int>(count_v->get<int64_t>());
    if (error->is_string()) m.error = error->get<std::string>();
  } catch (const std::bad_alloc&) {  // not damage: the manifest may be whole
    return out_of_memory("manifest");
  } catch (const std::exception& e) {
    return data_loss(std::string("manifest: ") + e.what());
  }
  m.index = std::move(index).value();
  m.index.metadata_json = "{}";
  return m;
}

namespace {

// The doubled region of boxes that form a grid, as a sharded save's do (each
// dimension cut at the same places for every box: what JAX's shardings
// give): each box is then one cell, and two boxes overlap only if they are
// the same cell. "" if none is doubled; nullopt if the boxes are no grid
// (the caller compares them pairwise). n log n where the pairwise sweep is
// quadratic in the boxes sharing rows (a split of dimension 1 over 8,192
// devices: 33 million pairs per leaf).
std::optional<std::string> doubled_grid_cell(const std::vector<Box>& boxes, const std::vector<size_t>& live,
                                             const std::vector<std::string>& owner) {
  if (live.empty()) return std::string();
  const size_t rank = boxes[live[0]].start.size();
  std::vector<std::vector<int64_t>> cuts(rank);
  for (size_t i : live)
    for (size_t d = 0; d < rank; ++d) {
      cuts[d].push_back(boxes[i].start[d]);
      cuts[d].push_back(boxes[i].stop[d]);
    }
  for (auto& c : cuts) {
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
  }
  std::map<std::vector<uint32_t>, size_t> cell_of;  // cell -> the box in it
  std::vector<uint32_t> cell(rank);
  for (size_t i : live) {
    for (size_t d = 0; d < rank; ++d) {
      const auto at = std::lower_bound(cuts[d].begin(), cuts[d].end(), boxes[i].start[d]) - cuts[d].begin();
      if (static_cast<size_t>(at) + 1 >= cuts[d].size() || cuts[d][at + 1] != boxes[i].stop[d]) return std::nullopt;
      cell[d] = static_cast<uint32_t>(at);
    }
    auto [it, fresh] = cell_of.emplace(cell, i);
    if (!fresh) return region(boxes[i]) + " are written by " + owner[it->second] + " and " + owner[i];
  }
  return std::string();
}

}  // namespace

std::optional<std::string> describe_cover_problem(const Shape& shape, const std::vector<Box>& boxes,
                                                  const std::vector<std::string>& owner) {
  const uint64_t total = checked_num_bytes(shape).value_or(0);
  std::vector<size_t> live;
  for (size_t i = 0; i < boxes.size(); ++i)
    if (volume(boxes[i]) > 0) live.push_back(i);
  // Doubled regions: sort along dimension 0 and compare each box with those
  // starting before it ends there (pairwise among overlapping rows).
  const size_t rank = shape.size();
  if (rank == 0) {
    if (live.size() > 1)
      return "the scalar is written by " + owner[live[0]] + " and " + owner[live[1]];
  } else if (auto doubled = doubled_grid_cell(boxes, live, owner)) {
    if (!doubled->empty()) return *doubled;
  } else {
    std::sort(live.begin(), live.end(), [&](size_t a, size_t b) { return boxes[a].start[0] < boxes[b].start[0]; });
    for (size_t i = 0; i < live.size(); ++i)
      for (size_t j = i + 1; j < live.size() && boxes[live[j]].start[0] < boxes[live[i]].stop[0]; ++j)
        if (auto both = intersect(boxes[live[i]], boxes[live[j]]))
          return region(*both) + " are written by " + owner[live[i]] + " and " + owner[live[j]];
  }
  uint64_t covered = 0;
  for (size_t i : live) covered += volume(boxes[i]);
  if (covered == total) return std::nullopt;
  // A hole: subtract every box from the whole shape, within a budget.
  constexpr size_t kMaxPieces = 4096;
  std::vector<Box> rest{Box::whole(shape)}, next;
  for (size_t i : live) {
    next.clear();
    for (const Box& r : rest) subtract(r, boxes[i], &next);
    rest.swap(next);
    if (rest.size() > kMaxPieces) break;
  }
  if (rest.empty() || rest.size() > kMaxPieces)
    return std::to_string(total - covered) + " of " + std::to_string(total) + " elements are written by no process";
  return region(rest.front()) + (rank == 0 ? " is" : " are") + " written by no process";
}

Result<Index> merge_manifests(std::vector<Manifest> manifests) {
  std::sort(manifests.begin(), manifests.end(),
            [](const Manifest& a, const Manifest& b) { return a.process_index < b.process_index; });
  for (const Manifest& m : manifests)
    if (m.error)
      return Status(Code::kFailedPrecondition,
                    "process " + std::to_string(m.process_index) +
                        " failed: " + printable(*m.error, kQuotedErrorMax));
  Index out;
  struct Merged {
    size_t prefix = 0, leaf = 0;
    std::vector<std::string> owner;  // per shard: "process N"
  };
  std::map<std::pair<std::string, std::string>, Merged> at;
  std::map<std::string, size_t> prefix_at;
  std::map<std::string, std::string> file_owner;  // data file name -> "process N"
  for (Manifest& m : manifests) {
    const std::string who = "process " + std::to_string(m.process_index);
    // Each process writes files of its own; two manifests claiming one file
    // would make an index that lists it twice (and one process's bytes
    // described by another's records).
    for (DataFileRecord& f : m.index.files) {
      auto [it, fresh] = file_owner.emplace(f.name, who);
      if (!fresh)
        return Status(Code::kFailedPrecondition,
                      "data file " + f.name + " is listed by " + it->second + " and by " + who);
      out.files.push_back(std::move(f));
    }
    for (PrefixRecord& p : m.index.prefixes) {
      auto [pit, pfresh] = prefix_at.emplace(p.name, out.prefixes.size());
      if (pfresh) out.prefixes.push_back(PrefixRecord{p.name, {}});
      auto& leaves = out.prefixes[pit->second].leaves;
      for (LeafRecord& leaf : p.leaves) {
        auto [it, fresh] = at.emplace(std::pair{p.name, leaf.path}, Merged{pit->second, leaves.size(), {}});
        if (fresh) {
          leaves.push_back(LeafRecord{leaf.path, leaf.dtype, leaf.shape, {}, {}});
        } else {
          const LeafRecord& first = leaves[it->second.leaf];
          if (first.dtype != leaf.dtype || first.shape != leaf.shape)
            return Status(Code::kFailedPrecondition,
                          p.name + "/" + leaf.path + ": " + who + " saved it as " +
                              std::string(dtype_name(leaf.dtype)) + shape_to_string(leaf.shape) +
                              ", an earlier process as " + std::string(dtype_name(first.dtype)) +
                              shape_to_string(first.shape));
        }
        LeafRecord& dst = leaves[it->second.leaf];
        for (ShardRecord& s : leaf.shards) {
          dst.shards.push_back(std::move(s));
          it->second.owner.push_back(who);
        }
      }
    }
  }
  for (auto& [name, merged] : at) {
    LeafRecord& leaf = out.prefixes[merged.prefix].leaves[merged.leaf];
    std::vector<Box> boxes;
    boxes.reserve(leaf.shards.size());
    for (const ShardRecord& s : leaf.shards) boxes.push_back(s.box);
    if (auto problem = describe_cover_problem(leaf.shape, boxes, merged.owner))
      return Status(Code::kFailedPrecondition, name.first + "/" + name.second + ": " + *problem);
    // Index order: shards sorted by box, whoever wrote them.
    std::vector<size_t> order(leaf.shards.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const Box& x = leaf.shards[a].box;
      const Box& y = leaf.shards[b].box;
      return std::tie(x.start, x.stop) < std::tie(y.start, y.stop);
    });
    std::vector<ShardRecord> sorted;
    sorted.reserve(order.size());
    for (size_t i : order) sorted.push_back(std::move(leaf.shards[i]));
    leaf.shards = std::move(sorted);
  }
  return out;
}

}  // namespace ckptio
