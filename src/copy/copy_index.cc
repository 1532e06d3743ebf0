// The index a copy commits: the source's, with only the data file names
// changed.
//
// Why rewrite the text instead of serialize_index(parsed): the parser ignores
// fields it does not know (format.md §4), so parsing and serializing again
// would silently drop whatever a newer writer of the same version added. The
// text is edited as a JSON tree in document order instead (nlohmann's
// ordered_json), touching only `files[].name` and every shard's `file`. The
// source text already passed the strict parser, so the tree holds no
// duplicate keys, no invalid UTF-8 and no hostile nesting. The result is
// written compactly (shorter than the writer's indented layout, which
// matters against IndexLimits::max_bytes) and parsed back before anything
// is committed.
#include <nlohmann/json.hpp>

#include <new>

#include "src/copy/copy.h"
#include "src/util/json_free.h"

namespace ckptio {

Index rename_data_files(const Index& index, const std::map<std::string, std::string>& renames) {
  Index out = index;
  auto rename = [&](std::string& name) {
    auto it = renames.find(name);
    if (it != renames.end()) name = it->second;
  };
  for (DataFileRecord& f : out.files) rename(f.name);
  for (PrefixRecord& p : out.prefixes)
    for (LeafRecord& leaf : p.leaves)
      for (ShardRecord& s : leaf.shards) rename(s.file);
  return out;
}

Result<std::string> rewrite_index_text(std::string_view src_text, const Index& src,
                                       const std::map<std::string, std::string>& renames) {
  std::string text;
  try {
    nlohmann::ordered_json doc;
    JsonFreer free_doc(doc);
    parse_json_into(doc, src_text);
    auto rename = [&](nlohmann::ordered_json& name) {
      auto it = renames.find(name.get<std::string>());
      if (it == renames.end())
        throw std::runtime_error("data file '" + name.get<std::string>() + "' has no new name");
      name = it->second;
    };
    for (auto& f : doc.at("files")) rename(f.at("name"));
    for (auto& leaves : doc.at("prefixes"))
      for (auto& leaf : leaves)
        for (auto& shard : leaf.at("shards")) rename(shard.at("file"));
    text = doc.dump();
  } catch (const std::bad_alloc&) {
    return out_of_memory("rewrite the index for the copy");
  } catch (const std::exception& e) {
    return internal_error(std::string("rewrite the index for the copy: ") + e.what());
  }
  auto back = parse_index(text);
  if (!back.ok())
    return back.status().annotate("internal: the rewritten index fails to parse");
  if (*back != rename_data_files(src, renames))
    return internal_error("the rewritten index does not read back as the source step");
  return text;
}

bool same_step(const Index& a, const Index& b) {
  auto by_position = [](const Index& x) {
    std::map<std::string, std::string> names;
    for (size_t i = 0; i < x.files.size(); ++i) names[x.files[i].name] = "#" + std::to_string(i);
    return rename_data_files(x, names);
  };
  return a.files.size() == b.files.size() && by_position(a) == by_position(b);
}

}  // namespace ckptio
