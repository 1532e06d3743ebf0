// An eformer step into ckptio's index model (contract in eformer_step.h).
#include "src/layout/zarr/eformer_step.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/eformer_index.h"
#include "src/layout/zarr/zarray.h"
#include "src/util/iso8601.h"
#include "src/storage/own_objects.h"

namespace ckptio::zarr {
namespace {

constexpr uint64_t kMaxMetadataBytes = 1 << 20;
constexpr std::string_view kZArrayName = ".zarray";

bool ends_with_zarray(std::string_view rel) {
  return rel == kZArrayName ||
         (rel.size() > kZArrayName.size() && rel.ends_with(kZArrayName) &&
          rel[rel.size() - kZArrayName.size() - 1] == '/');
}

struct Listed {
  std::map<std::string, uint64_t> top;  // objects directly in the step directory: name -> size
  std::vector<const ListEntry*> all;
};

// The arrays of the step's index or indexes, as (prefix, array).
Result<std::vector<std::pair<std::string, EformerArray>>> read_indexes(Storage& storage, const std::string& dir,
                                                                       const Listed& listed) {
  std::vector<std::pair<std::string, EformerArray>> arrays;
  auto read = [&](const std::string& name) -> Result<std::string> {
    auto text = get_own_object(storage, dir + "/" + name, EformerIndexLimits{}.max_bytes);
    if (!text.ok()) return text.status().annotate("read " + storage.describe() + "/" + dir + "/" + name);
    return text;
  };
  auto take = [&](const EformerIndex& index) {
    for (const EformerPrefix& p : index.prefixes)
      for (const EformerArray& a : p.arrays) arrays.emplace_back(p.name, a);
    if (index.arrays)
      for (const EformerArray& a : *index.arrays) arrays.emplace_back("", a);
  };
  for (const auto& [name, size] : listed.top) {
    (void)size;
    const std::string where = storage.describe() + "/" + dir + "/" + name;
    if (name == kEformerIndexName) {
      CKPTIO_ASSIGN_OR_RETURN(std::string text, read(name));
      auto index = parse_eformer_index(text);
      if (!index.ok()) return index.status().annotate(where);
      take(*index);
    } else if (auto prefix = prefix_of_index_name(name)) {
      CKPTIO_ASSIGN_OR_RETURN(std::string text, read(name));
      auto index = parse_eformer_prefix_index(*prefix, text);
      if (!index.ok()) return index.status().annotate(where);
      take(*index);
    }
  }
  return arrays;
}

// eformer's reader: the array's key path, without its prefix.
std::string leaf_path(const std::string& prefix, const std::string& array_dir) {
  std::string key = key_path_of_array_dir(array_dir);
  if (!prefix.empty() && key.size() > prefix.size() && key.starts_with(prefix) && key[prefix.size()] == '.')
    key.erase(0, prefix.size() + 1);
  return key;
}

}  // namespace

bool looks_like_eformer_step(const std::string& dir, const std::vector<ListEntry>& objects) {
  const std::string head = dir + "/";
  for (const ListEntry& o : objects) {
    if (!o.key.starts_with(head)) continue;
    const std::string_view rel = std::string_view(o.key).substr(head.size());
    if (rel == kEformerMetadataName || rel == kEformerIndexName ||
        (rel.find('/') == std::string_view::npos && prefix_of_index_name(rel)) || ends_with_zarray(rel))
      return true;
  }
  return false;
}

bool is_unfinished_eformer_step(const std::string& dir, const std::vector<ListEntry>& objects) {
  const std::string head = dir + "/";
  auto chunk_key = [](std::string_view rel) {  // the last name: digits and '.' ("0", "1.0")
    const std::string_view last = rel.substr(rel.rfind('/') + 1);
    return !last.empty() && last.front() != '.' && last.back() != '.' &&
           last.find_first_not_of("0123456789.") == std::string_view::npos;
  };
  bool any = false;
  for (const ListEntry& o : objects) {
    if (!o.key.starts_with(head)) continue;
    const std::string_view rel = std::string_view(o.key).substr(head.size());
    const bool top = rel.find('/') == std::string_view::npos;
    if (top && rel == kEformerMetadataName) return false;
    if (!(ends_with_zarray(rel) || (top && (rel == kEformerIndexName || prefix_of_index_name(rel).has_value())) ||
          (!top && chunk_key(rel))))
      return false;
    any = true;
  }
  return any;
}

namespace {

// metadata.json into `index`: its timestamp as the step's times, its text as
// the step's metadata (eformer / EasyDeL wrote it; kept as is).
Status read_step_metadata(Storage& storage, const std::string& head, int64_t step, Index* index) {
  const std::string key = head + std::string(kEformerMetadataName);
  auto text = get_own_object(storage, key, kMaxMetadataBytes);
  if (!text.ok()) return text.status().annotate("read " + storage.describe() + "/" + key);
  auto meta = parse_eformer_metadata(*text);
  if (!meta.ok()) return meta.status().annotate(storage.describe() + "/" + key);
  if (meta->step && *meta->step != step)
    return data_loss(storage.describe() + "/" + key + ": says step " + std::to_string(*meta->step) +
                     ", but its directory names step " + std::to_string(step));
  // (An index's times are Unix nanoseconds, never negative: a time before
  // 1970 is no commit time, as one that is not a time.)
  if (meta->timestamp)
    if (auto ns = parse_iso8601_ns(*meta->timestamp, TimeZones::kAny); ns && *ns >= 0)
      index->committed_unix_ns = index->created_unix_ns = *ns;
  index->metadata_json = *text;
  while (!index->metadata_json.empty() &&
         (index->metadata_json.back() == '\n' || index->metadata_json.back() == ' '))
    index->metadata_json.pop_back();
  return Status::OK();
}

// Each listed object to its array and chunk: an array's directory is a
// prefix of the key ending at a '/'; arrays never nest (check_array_path).
// The leaves are in `index` already, in the order of `arrays` per prefix.
void attach_chunks(const Listed& listed, const std::string& head,
                   const std::vector<std::pair<std::string, EformerArray>>& arrays,
                   const std::unordered_map<std::string, size_t>& by_dir, const std::vector<ZArray>& parsed,
                   std::map<std::string, size_t>& prefix_at, Index* out) {
  Index& index = *out;
  std::vector<LeafRecord*> leaf_of(arrays.size());
  {
    std::map<std::string, size_t> next;
    for (size_t i = 0; i < arrays.size(); ++i) {
      PrefixRecord& p = index.prefixes[prefix_at[arrays[i].first]];
      leaf_of[i] = &p.leaves[next[arrays[i].first]++];
    }
  }
  for (const ListEntry* e : listed.all) {
    const std::string rel = e->key.substr(head.size());
    for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1)) {
      auto it = by_dir.find(rel.substr(0, slash));
      if (it == by_dir.end()) continue;
      const ZArray& z = parsed[it->second];
      auto chunk = parse_chunk_key(z, std::string_view(rel).substr(slash + 1));
      if (chunk) {
        ShardRecord s;
        s.box = chunk_valid_box(z, *chunk);
        s.file = rel;
        s.offset = 0;
        s.length = e->size;
        leaf_of[it->second]->shards.push_back(std::move(s));
        index.files.push_back(DataFileRecord{rel, e->size});
      }
      break;
    }
  }
}

}  // namespace

Result<std::optional<Index>> load_eformer_step(Storage& storage, const std::string& dir, int64_t step) {
  const std::string head = dir + "/";
  CKPTIO_ASSIGN_OR_RETURN(ListResult objs, storage.list(head, /*delimiter=*/false));
  if (!looks_like_eformer_step(dir, objs.objects)) return std::optional<Index>();
  const std::string where = storage.describe() + "/" + dir;
  Listed listed;
  for (const ListEntry& o : objs.objects) {
    if (!o.key.starts_with(head)) continue;
    listed.all.push_back(&o);
    const std::string rel = o.key.substr(head.size());
    if (rel.find('/') == std::string::npos) listed.top.emplace(rel, o.size);
  }
  auto in_progress = [&](const std::string& why) {
    return not_found("step " + std::to_string(step) + " at " + where + " is an eformer step that is not complete (" +
                     why + "): a save in progress, or one that never finished");
  };
  if (!listed.top.count(std::string(kEformerMetadataName))) return in_progress("no metadata.json");
  const bool has_index = std::any_of(listed.top.begin(), listed.top.end(), [](const auto& kv) {
    return kv.first == kEformerIndexName || prefix_of_index_name(kv.first).has_value();
  });
  if (!has_index) return in_progress("no tensorstore_index.json");

  Index index;
  index.layout = kEformerLayout;
  index.step = step;
  CKPTIO_RETURN_IF_ERROR(read_step_metadata(storage, head, step, &index));

  CKPTIO_ASSIGN_OR_RETURN(auto arrays, read_indexes(storage, dir, listed));

  // Every array's .zarray, in one parallel read.
  std::unordered_map<std::string, size_t> by_dir;  // array directory -> position in `arrays`
  std::vector<ReadRequest> requests;
  std::vector<uint64_t> zarray_size(arrays.size());
  uint64_t total = 0;
  std::vector<std::string_view> dirs;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const std::string& path = arrays[i].second.path;
    if (!by_dir.emplace(path, i).second)
      return data_loss(where + ": the eformer index lists array " + path + " twice");
    dirs.push_back(path);
  }
  // An array inside another's directory, listed by another index file: its
  // chunks would be taken for the outer array's.
  if (Status st = check_array_dirs(std::move(dirs)); !st.ok()) return st.annotate(where);
  std::unordered_map<std::string, uint64_t> sizes;
  sizes.reserve(listed.all.size());
  for (const ListEntry* e : listed.all) sizes.emplace(e->key.substr(head.size()), e->size);
  for (size_t i = 0; i < arrays.size(); ++i) {
    auto it = sizes.find(arrays[i].second.path + "/" + std::string(kZArrayName));
    if (it == sizes.end()) return in_progress("no " + arrays[i].second.path + "/.zarray");
    if (it->second > ZArrayLimits{}.max_bytes)
      return data_loss(where + "/" + arrays[i].second.path + "/.zarray: " + std::to_string(it->second) +
                       " bytes, more than the limit of " + std::to_string(ZArrayLimits{}.max_bytes));
    zarray_size[i] = it->second;
    total += it->second;
  }
  std::string texts(total, '\0');
  for (size_t i = 0, at = 0; i < arrays.size(); at += zarray_size[i], ++i)
    requests.push_back(ReadRequest{head + arrays[i].second.path + "/" + std::string(kZArrayName), 0, zarray_size[i],
                                   reinterpret_cast<std::byte*>(texts.data() + at)});
  if (!requests.empty()) {
    Status st = storage.read(requests);
    if (!st.ok()) return st.annotate("read the .zarray files of " + where);
  }

  // Leaves, prefixes in the order the index gives them.
  std::vector<ZArray> parsed(arrays.size());
  std::map<std::string, size_t> prefix_at;
  std::map<std::pair<std::string_view, std::string>, std::string_view> leaf_dirs;  // (prefix, leaf) -> array
  for (size_t i = 0, at = 0; i < arrays.size(); at += zarray_size[i], ++i) {
    const auto& [prefix, a] = arrays[i];
    const std::string file = where + "/" + a.path + "/.zarray";
    auto z = parse_zarray(std::string_view(texts).substr(at, zarray_size[i]));
    if (!z.ok()) return z.status().annotate(file);
    if (z->shape != a.shape)
      return data_loss(file + ": shape " + shape_to_string(z->shape) + ", but the eformer index says " +
                       shape_to_string(a.shape));
    if (a.dtype && *a.dtype != z->dtype)
      return data_loss(file + ": dtype " + z->dtype_text + ", but the eformer index says " + a.dtype_name);
    auto [pit, fresh] = prefix_at.emplace(prefix, index.prefixes.size());
    if (fresh) index.prefixes.push_back(PrefixRecord{prefix, {}});
    LeafRecord leaf;
    leaf.path = leaf_path(prefix, a.path);
    // Two directories that name one leaf ("a/b.c" and "a.b/c"; "model/w"
    // and "w" in prefix model): eformer splits every '.' of a key path, so
    // it writes neither twin, and a restore would fill one leaf from both.
    if (auto [it, fresh] = leaf_dirs.emplace(std::pair{std::string_view(prefix), leaf.path}, a.path); !fresh)
      return data_loss(where + ": arrays " + std::string(it->second) + " and " + a.path + " of prefix " +
                       (prefix.empty() ? std::string("\"\"") : prefix) + " both name the leaf " + leaf.path +
                       " (their directories differ only in '.' and '/', or in the prefix)");
    leaf.dtype = z->dtype;
    leaf.shape = z->shape;
    leaf.zarray.assign(texts, at, zarray_size[i]);
    index.prefixes[pit->second].leaves.push_back(std::move(leaf));
    parsed[i] = std::move(*z);
  }
  attach_chunks(listed, head, arrays, by_dir, parsed, prefix_at, &index);
  return std::optional<Index>(std::move(index));
}

}  // namespace ckptio::zarr
