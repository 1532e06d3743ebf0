// What a checkpoint directory holds beyond its committed steps: unfinished
// multipart uploads, and objects (or files) no committed index references.
// After gc() with no save in flight, both must be empty.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "ckptio/ckptio.h"

namespace ckptio::testutil {

struct Leftovers {
  Status status;                     // not OK: listing failed (the rest is partial)
  std::vector<int64_t> steps;        // committed steps
  std::vector<std::string> uploads;  // list_unfinished("")
  std::vector<std::string> orphans;  // keys no committed step's index names

  bool empty() const { return uploads.empty() && orphans.empty(); }
  std::string describe() const {
    std::string s = std::to_string(uploads.size()) + " unfinished uploads, " +
                    std::to_string(orphans.size()) + " unreferenced objects";
    for (size_t i = 0; i < uploads.size() && i < 5; ++i) s += "\n  upload " + uploads[i];
    for (size_t i = 0; i < orphans.size() && i < 5; ++i) s += "\n  object " + orphans[i];
    return s;
  }
};

// Step directories are named by the manager's step_format; `index_name` is
// the index's file name inside one (docs/format.md).
inline Leftovers find_leftovers(CheckpointManager& m,
                                const std::string& index_name = kIndexFileName) {
  Leftovers out;
  auto steps = m.all_steps();
  if (!steps.ok()) {
    out.status = steps.status();
    return out;
  }
  out.steps = *steps;
  auto unfinished = m.storage().list_unfinished("");
  if (!unfinished.ok() && unfinished.status().code() != Code::kUnimplemented) {
    out.status = unfinished.status();
    return out;
  }
  if (unfinished.ok())
    for (const ListEntry& u : *unfinished) out.uploads.push_back(u.key);
  std::set<std::string> live;
  std::vector<std::string> live_dirs;  // eformer steps: every object under one is the step's
  for (int64_t s : *steps) {
    auto idx = m.read_index(s);
    if (!idx.ok()) {
      out.status = idx.status();
      return out;
    }
    std::string dir = m.options().step_format;
    dir.replace(dir.find("{step}"), 6, std::to_string(s));
    live.insert(dir + "/" + index_name);
    for (const auto& f : idx->files) live.insert(dir + "/" + f.name);
    if (idx->layout == "eformer") live_dirs.push_back(dir + "/");
  }
  auto in_live_dir = [&](const std::string& key) {
    for (const std::string& d : live_dirs)
      if (key.starts_with(d)) return true;
    return false;
  };
  auto all = m.storage().list("", false);
  if (!all.ok()) {
    out.status = all.status();
    return out;
  }
  for (const auto& o : all->objects)
    if (!live.count(o.key) && !in_live_dir(o.key)) out.orphans.push_back(o.key);
  return out;
}

}  // namespace ckptio::testutil
