// The fast reader of the index (index_readers::read_index_fast and the
// reading of a text that is still arriving). docs/format.md is the contract
// (§3.3, "Two readers, one result").
//
// parse_index tries this reader first. It reads the plain form of an index,
// the one serialize_index writes (members in any order, any JSON
// whitespace): strings of printable ASCII without escapes, numbers that are
// unsigned integers, only the schema's members. It stores straight into the
// Index, with no JSON values in between, and runs the record checks of
// checks.cc. At any surprise - anything else in the text, a duplicate or
// missing member, a limit reached, a failed check - it gives up, and the
// strict reader reads the text from the start and names the problem. The metadata
// object is handed whole to the strict reader (its end found by
// end_of_container, src/util/json_scan.h), which writes its canonical text. So
// it never takes what the strict reader refuses and gives the same Index;
// fuzz/index_fuzz.cc checks that on every input. Beyond the Index it keeps a
// hash per leaf of the prefix being read and a FileRun per run of shards
// naming one file (so the duplicate-path and shard-file checks need not walk
// every record again, cold, after the read).
// `build/bin/micro_bench --benchmark_filter=IndexParse` (100,000 leaves,
// 24.5 MB): 273 ms for the strict reader, 67 ms for this one.
//
// Two threads read a large index (kSplitBytes and up): a helper reads leaves
// from a split point near the middle (the first '{"path"' after it) while
// this thread reads from the start. When this thread arrives exactly at the
// split point, about to read a leaf of a prefix's array, the text from there
// is the helper's run of leaves, token for token; it takes the helper's
// leaves (or gives up if the helper did: it would have failed on the same
// token) and goes on after them. Limits that count across leaves (leaves,
// total bytes) are checked when the runs join. If it never arrives there
// (the point lay in metadata, a file name, ...), the helper's work is
// dropped. Either way the result is the one-thread result; the fuzzer and
// IndexReaders tests force split points to check that.
//
// A text may also be read while it arrives (parse_index_arriving): the
// first part is in, the rest is brought in by the helper before it reads
// its run. The split point then lies in the first part, and this thread
// reads only the first part (text_ and end_ end there) until it takes the
// helper's run, after which the whole text is in. A text that would make it
// read beyond (not what serialize_index writes) fails the fast reader.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/index/index_internal.h"
#include "src/index/index_readers.h"
#include "src/util/async.h"
#include "src/util/json_scan.h"
#include "src/util/position_table.h"

namespace ckptio::index_internal {
namespace {

class FastReader {
 public:
  explicit FastReader(const IndexLimits& limits) : limits_(limits) {}

  static constexpr size_t kSplitBytes = 1u << 20;
  static constexpr size_t kNoSplit = std::string_view::npos;


  // False: not taken (the strict reader decides). `split`: where a helper
  // reads leaves (kNoSplit: none; default: near the middle of a large text).
  // `arriving`: see above; when all of the text is in already, it is read
  // as any text and rest() is left to the caller.
  bool read(std::string_view text, Index* out, std::optional<size_t> split = std::nullopt,
            Arriving* arriving = nullptr) {
    if (text.size() > limits_.max_bytes || limits_.max_depth < kSchemaDepth ||
        limits_.max_depth > kMaxSupportedDepth)
      return false;
    text_ = whole_ = text;
    p_ = text.data();
    end_ = p_ + text.size();
    if (arriving && arriving->loaded < text.size()) {
      const std::string_view first = text.substr(0, arriving->loaded);
      start_helper(split                           ? *split
                   : text.size() >= kSplitBytes ? first.rfind("{\"path\"")  // the last leaf that is in
                                                : kNoSplit,
                   arriving);
      if (split_) {
        text_ = first;  // until the helper's run is taken
        end_ = first.data() + first.size();
      } else if (!arriving->bring()) {  // no split point in the first part, or no thread: all of it now
        return false;
      }
    } else {
      start_helper(split ? *split : text.size() >= kSplitBytes ? text.find("{\"path\"", text.size() / 2) : kNoSplit);
    }
    if (!read_root()) return false;
    if (text_.size() != whole_.size()) {  // done before taking the helper's run, which is dropped:
      split_ = nullptr;                   // what follows must be in before it is checked
      (void)helper_.get();
      if (!arriving->bring()) return false;
      text_ = whole_;
      end_ = whole_.data() + whole_.size();
    }
    skip_space();
    if (p_ != end_) return false;
    std::unordered_map<std::string_view, size_t> files;
    if (check_file_table(index_.files, &files)) return false;
    for (const FileRun& r : file_runs_) {  // check_shard_files, by runs
      auto it = files.find(r.name);
      if (it == files.end() || r.end > index_.files[it->second].size) return false;
    }
    *out = std::move(index_);
    return true;
  }

 private:
  // Root, prefixes, leaves, leaf, shards, shard, box, coordinates.
  static constexpr uint32_t kSchemaDepth = 8;

  // Shards naming one file one after another (in the text), and the
  // furthest byte they reach: what check_shard_files checks, without a
  // second pass over every shard.
  struct FileRun {
    std::string_view name;  // in the text
    uint64_t end = 0;
  };

  // ---- The helper ----

  struct Run {
    bool ok = false;
    std::vector<LeafRecord> leaves;
    std::vector<size_t> path_hashes;
    std::vector<FileRun> file_runs;
    const char* end = nullptr;  // after the last leaf
    uint64_t total_bytes = 0;
  };

  void start_helper(size_t at, Arriving* arriving = nullptr) {
    if (at >= text_.size()) return;
    split_ = text_.data() + at;
    helper_ = try_async("ckptio-index", [limits = limits_, text = text_, from = split_, arriving] {
      if (arriving && !arriving->bring()) return Run{};
      FastReader h(limits);
      h.text_ = h.whole_ = text;
      h.p_ = from;
      h.end_ = text.data() + text.size();
      Run run;
      run.ok = h.read_leaf_run(&run.leaves);
      run.end = h.p_;
      run.total_bytes = h.total_bytes_;
      run.path_hashes = std::move(h.path_hashes_);
      run.file_runs = std::move(h.file_runs_);
      return run;
    });
    if (!helper_.valid()) split_ = nullptr;  // no thread to be had: one thread reads all
  }
  // `leaf (, leaf)*`, as a prefix's array holds them; stops before what
  // follows the last leaf.
  bool read_leaf_run(std::vector<LeafRecord>* leaves) {
    do {
      if (leaves->size() >= limits_.max_leaves || !read_leaf(leaves->emplace_back())) return false;
      skip_space();
    } while (p_ < end_ && *p_ == ',' && (++p_, true));
    return true;
  }
  // At the split point, at a leaf of `leaves`: the helper's run joins them.
  bool take_helper_run(std::vector<LeafRecord>* leaves) {
    split_ = nullptr;
    Run run = helper_.get();
    text_ = whole_;  // all in now, if it was arriving
    end_ = whole_.data() + whole_.size();
    if (!run.ok || run.leaves.empty()) return false;
    if (run.leaves.size() > limits_.max_leaves - std::min(limits_.max_leaves, num_leaves_)) return false;
    if (__builtin_add_overflow(total_bytes_, run.total_bytes, &total_bytes_)) return false;
    num_leaves_ += run.leaves.size();
    leaves->reserve(leaves->size() + run.leaves.size());
    std::move(run.leaves.begin(), run.leaves.end(), std::back_inserter(*leaves));
    path_hashes_.insert(path_hashes_.end(), run.path_hashes.begin(), run.path_hashes.end());
    file_runs_.insert(file_runs_.end(), run.file_runs.begin(), run.file_runs.end());
    p_ = run.end;
    return true;
  }

  // ---- Tokens ----

  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool eat(char c) {
    skip_space();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // A string of printable ASCII without escapes.
  bool text(std::string_view* out) {
    if (!eat('"')) return false;
    const char* begin = p_;
    for (; p_ < end_; ++p_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *out = std::string_view(begin, static_cast<size_t>(p_++ - begin));
        return true;
      }
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
    }
    return false;
  }
  bool text(std::string* out) {
    std::string_view s;
    if (!text(&s)) return false;
    out->assign(s);
    return true;
  }
  // An unsigned integer as JSON writes one (no leading zero, no fraction or
  // exponent: the strict reader calls those floats).
  bool u64(uint64_t* out) {
    skip_space();
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    const bool zero = *p_ == '0';
    uint64_t v = 0;
    const char* begin = p_;
    for (; p_ < end_ && *p_ >= '0' && *p_ <= '9'; ++p_)
      if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<uint64_t>(*p_ - '0'), &v))
        return false;
    if (zero && p_ - begin > 1) return false;
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;
    *out = v;
    return true;
  }
  bool i64(int64_t* out) {
    uint64_t u;
    if (!u64(&u) || u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  // The members of an object: member(key) reads each value.
  template <class F>
  bool object(F&& member) {
    if (!eat('{')) return false;
    if (eat('}')) return true;
    do {
      std::string_view key;
      if (!text(&key) || !eat(':') || !member(key)) return false;
    } while (eat(','));
    return eat('}');
  }
  template <class F>
  bool array(F&& element) {
    if (!eat('[')) return false;
    if (eat(']')) return true;
    do {
      if (!element()) return false;
    } while (eat(','));
    return eat(']');
  }
  // Each member once; `bit` is its place in `*seen`.
  static bool once(uint32_t* seen, uint32_t bit) {
    if (*seen & bit) return false;
    *seen |= bit;
    return true;
  }
  // Into `out` (empty), with one allocation of the exact size for up to
  // eight coordinates: push_back would allocate 1, 2, 4, ... elements, and
  // a leaf has three such lists (shape, box start and stop).
  bool coordinates(std::vector<int64_t>* out) {
    int64_t first[8];
    size_t n = 0;
    const bool ok = array([&] {
      int64_t c;
      if (n == limits_.max_rank || !i64(&c)) return false;
      if (n < std::size(first)) {
        first[n++] = c;
        return true;
      }
      if (n++ == std::size(first)) out->assign(first, first + std::size(first));
      out->push_back(c);
      return true;
    });
    if (ok && n <= std::size(first)) out->assign(first, first + n);
    return ok;
  }

  // ---- Records ----

  bool read_root() {
    uint32_t seen = 0;
    const bool ok = object([&](std::string_view key) {
      std::string_view s;
      uint64_t version;
      if (key == "format") return once(&seen, 1) && text(&s) && s == kIndexFormat;
      if (key == "version")
        return once(&seen, 2) && u64(&version) && version == static_cast<uint64_t>(kIndexVersion);
      if (key == "step") return once(&seen, 4) && i64(&index_.step);
      if (key == "created_unix_ns") return once(&seen, 8) && i64(&index_.created_unix_ns);
      if (key == "committed_unix_ns") return once(&seen, 16) && i64(&index_.committed_unix_ns);
      if (key == "metadata") return once(&seen, 32) && read_metadata_member();
      if (key == "files") return once(&seen, 64) && read_files();
      if (key == "prefixes") return once(&seen, 128) && read_prefixes();
      if (key == "created_at") return once(&seen, 256) && text(&s);
      if (key == "committed_at") return once(&seen, 512) && text(&s);
      return false;
    });
    return ok && (seen & 255) == 255;
  }

  bool read_metadata_member() {
    skip_space();
    if (p_ == end_ || *p_ != '{') return false;
    const size_t at = static_cast<size_t>(p_ - text_.data());
    const size_t end = end_of_container(text_, at);
    if (end == std::string_view::npos) return false;
    auto canonical = read_metadata(text_.substr(at, end - at), limits_);
    if (!canonical.ok()) return false;
    index_.metadata_json = std::move(canonical).value();
    p_ = text_.data() + end;
    return true;
  }

  bool read_files() {
    return array([&] {
      DataFileRecord& file = index_.files.emplace_back();
      uint32_t seen = 0;
      return object([&](std::string_view key) {
               if (key == "name") return once(&seen, 1) && text(&file.name);
               if (key == "size") return once(&seen, 2) && u64(&file.size);
               return false;
             }) &&
             seen == 3 && !check_file_name(file);
    });
  }

  bool read_prefixes() {
    return object([&](std::string_view name) {
      // Prefixes are few: duplicates by a scan; many go to the strict reader.
      if (name.empty() || !is_safe_relative_name(name) || index_.prefixes.size() >= 64 ||
          index_.prefixes.size() >= limits_.max_object_members)
        return false;
      for (const PrefixRecord& p : index_.prefixes)
        if (p.name == name) return false;
      PrefixRecord& prefix = index_.prefixes.emplace_back();
      prefix.name.assign(name);
      path_hashes_.clear();
      return array([&] {
               if (split_) {
                 skip_space();
                 if (p_ == split_) return take_helper_run(&prefix.leaves);
               }
               return num_leaves_++ < limits_.max_leaves && read_leaf(prefix.leaves.emplace_back());
             }) &&
             path_hashes_.size() == prefix.leaves.size() && !check_leaf_paths(prefix.leaves, &path_hashes_);
    });
  }

  bool read_leaf(LeafRecord& leaf) {
    uint32_t seen = 0;
    return object([&](std::string_view key) {
             std::string_view s;
             if (key == "path") {
               if (!once(&seen, 1) || !text(&s) || s.empty()) return false;
               leaf.path.assign(s);
               path_hashes_.push_back(hash_names(s));
               return true;
             }
             if (key == "dtype") {
               if (!once(&seen, 2) || !text(&s)) return false;
               auto dt = parse_dtype(s);
               if (!dt) return false;
               leaf.dtype = *dt;
               return true;
             }
             if (key == "shape") return once(&seen, 4) && coordinates(&leaf.shape);
             if (key == "shards")
               return once(&seen, 8) && array([&] {
                        return leaf.shards.size() < limits_.max_shards_per_leaf &&
                               read_shard(leaf.shards.emplace_back());
                      });
             return false;
           }) &&
           seen == 15 && !check_leaf(leaf, limits_.partial_cover, &total_bytes_);
  }

  bool read_shard(ShardRecord& shard) {
    uint32_t seen = 0;
    std::string_view file;
    uint64_t end;
    return object([&](std::string_view key) {
             uint64_t crc;
             if (key == "box") return once(&seen, 1) && read_box(shard.box);
             if (key == "file") {
               if (!once(&seen, 2) || !text(&file)) return false;
               shard.file.assign(file);
               return true;
             }
             if (key == "offset") return once(&seen, 4) && u64(&shard.offset);
             if (key == "length") return once(&seen, 8) && u64(&shard.length);
             if (key == "crc32c") {
               if (!once(&seen, 16) || !u64(&crc) || crc > UINT32_MAX) return false;
               shard.crc32c = static_cast<uint32_t>(crc);
               return true;
             }
             return false;
           }) &&
           seen == 31 && (shard.length != 0 || shard.crc32c == 0) &&  // (the strict reader names it)
           !__builtin_add_overflow(shard.offset, shard.length, &end) && note_file_run(file, end);
  }
  bool note_file_run(std::string_view file, uint64_t end) {
    if (file_runs_.empty() || file_runs_.back().name != file) file_runs_.push_back(FileRun{file, end});
    else file_runs_.back().end = std::max(file_runs_.back().end, end);
    return true;
  }

  bool read_box(Box& box) {
    uint32_t seen = 0;
    return object([&](std::string_view key) {
             if (key == "start") return once(&seen, 1) && coordinates(&box.start);
             if (key == "stop") return once(&seen, 2) && coordinates(&box.stop);
             return false;
           }) &&
           seen == 3;
  }

  const IndexLimits limits_;
  std::string_view text_;   // what this thread may read: the whole text, or its first part while it arrives
  std::string_view whole_;  // the whole text
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  Index index_;
  uint64_t num_leaves_ = 0;
  uint64_t total_bytes_ = 0;
  std::vector<size_t> path_hashes_;  // of the leaves of the prefix being read (check_leaf_paths)
  std::vector<FileRun> file_runs_;
  const char* split_ = nullptr;  // while the helper's run is not taken
  std::future<Run> helper_;      // joined at the latest when this reader goes
};

}  // namespace

bool read_index_fast_arriving(std::string_view json, const IndexLimits& limits, Index* out,
                              std::optional<size_t> split, Arriving* arriving) {
  return FastReader(limits).read(json, out, split, arriving);
}

}  // namespace ckptio::index_internal

namespace ckptio::index_readers {

bool read_index_fast(std::string_view json, const IndexLimits& limits, Index* out) {
  return index_internal::FastReader(limits).read(json, out);
}

bool read_index_fast(std::string_view json, const IndexLimits& limits, Index* out, size_t split) {
  return index_internal::FastReader(limits).read(json, out, split);
}

}  // namespace ckptio::index_readers
