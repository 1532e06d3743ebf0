// CheckpointManager::verify: reads every shard of a step through the read
// executor (src/restore/read_executor.h) and checks its crc32c, listing every
// damaged file and shard instead of stopping at the first. Data files are
// checked first (stat): a missing or short file is named once with the
// shards it takes down. Errors that are not damage (transient, I/O,
// permission) end the verification at once.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "ckptio/manager.h"
#include "src/manager/manager_impl.h"
#include "src/restore/damage.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/restore/read_executor.h"
#include "src/restore/restore_zarr.h"
#include "src/util/allocate.h"
#include "src/util/crc32c.h"

namespace ckptio {
namespace {

// Shards are read in pieces of at most this much, staged in the executor's
// two arenas of kStagingBytes each: 64 MiB in all, two batches in flight.
constexpr uint64_t kPieceBytes = 16ull << 20;
constexpr uint64_t kStagingBytes = 32ull << 20;
constexpr size_t kMaxProblems = 20;

struct ShardCheck {
  const PrefixRecord* prefix = nullptr;
  const LeafRecord* leaf = nullptr;
  size_t shard = 0;
  uint32_t crc = 0;
  bool failed = false;  // a read of it failed: noted, its other pieces ignored
};

class Verifier : public ReadConsumer {
 public:
  Verifier(int64_t step, std::string at) : step_(step), at_(std::move(at)) {}

  // Reads of shard `s` (an index into checks()).
  void add(const ShardCheck& s, uint32_t file, std::vector<ExecRead>* reads) {
    const ShardRecord& rec = s.leaf->shards[s.shard];
    const size_t k = checks_.size();
    checks_.push_back(s);
    for (uint64_t off = 0; off < rec.length; off += kPieceBytes) {
      const uint64_t len = std::min(kPieceBytes, rec.length - off);
      reads->push_back(ExecRead{file, rec.offset + off, len});
      pieces_.push_back(Piece{k, off + len == rec.length});
    }
  }
  std::string where(const ShardCheck& s) const {
    const ShardRecord& rec = s.leaf->shards[s.shard];
    return s.prefix->name + "/" + s.leaf->path + " shard " + std::to_string(s.shard) + " (file " + rec.file + ", " +
           byte_range(rec.offset, rec.length) + ")";
  }
  void note(std::string p) {
    if (problems_.size() < kMaxProblems) problems_.push_back(std::move(p));
    ++count_;
  }
  const std::vector<std::string>& problems() const { return problems_; }
  size_t count() const { return count_; }

  Status landed(size_t i, const std::byte* bytes) override {
    ShardCheck& s = checks_[pieces_[i].check];
    if (s.failed) return Status::OK();
    const ExecRead& r = (*reads_)[i];
    s.crc = crc32c(bytes, r.length, s.crc);
    if (pieces_[i].last && s.crc != s.leaf->shards[s.shard].crc32c) note("checksum mismatch in " + where(s));
    return Status::OK();
  }
  Status failed(size_t i, Status st) override {
    ShardCheck& s = checks_[pieces_[i].check];
    if (s.failed) return Status::OK();
    Status named = data_read_error(st, "verify " + where(s), at_ + s.leaf->shards[s.shard].file);
    if (!named.data_loss()) return named.annotate("verify step " + std::to_string(step_));
    s.failed = true;
    note(named.message());
    return Status::OK();
  }
  void set_reads(const std::vector<ExecRead>* reads) { reads_ = reads; }
  void set_progress(ProgressReport* progress) { progress_ = progress; }
  void delivered(size_t, uint64_t bytes) override { progress_->update(bytes); }

 private:
  struct Piece {
    size_t check = 0;
    bool last = false;  // completes its shard
  };
  const int64_t step_;
  const std::string at_;
  std::vector<ShardCheck> checks_;
  std::vector<Piece> pieces_;  // parallel to the reads
  const std::vector<ExecRead>* reads_ = nullptr;
  ProgressReport* progress_ = nullptr;
  std::vector<std::string> problems_;
  size_t count_ = 0;
};

}  // namespace

Status CheckpointManager::verify(int64_t step, const ProgressHook& on_progress) {
  // (The read executor drains its reads before anything unwinds past it.)
  try {
    return verify_or_throw(step, on_progress);
  } catch (...) {
    return status_or_out_of_memory([&] { return status_of_exception("verify step " + std::to_string(step)); });
  }
}

Status CheckpointManager::verify_or_throw(int64_t step, const ProgressHook& on_progress) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  Impl::ReadMark mark(impl_.get(), step);  // retention leaves the step alone meanwhile
  CKPTIO_ASSIGN_OR_RETURN(Index index, read_index(step));
  const std::string dir = impl_->naming.name(step);
  if (index.layout == zarr::kEformerLayout) return verify_zarr(*storage_, dir, index, on_progress);
  const std::string at = storage_->describe() + "/" + dir + "/";
  // Data files first: a missing or short file is named once with the shards
  // it takes down, instead of once per shard.
  std::map<std::string, uint64_t> sizes;  // intact or longer files: their size
  std::map<std::string, uint32_t> ordinal;
  std::vector<std::string> keys;
  std::map<std::string, std::vector<std::string>> lost;  // file -> shards it takes down
  std::map<std::string, std::string> file_problem;
  for (const DataFileRecord& f : index.files) {
    ordinal[f.name] = static_cast<uint32_t>(keys.size());
    keys.push_back(dir + "/" + f.name);
    auto size = storage_->stat(dir + "/" + f.name);
    const Status& err = size.status();
    if (!size.ok() && err.code() != Code::kNotFound && !err.data_loss())
      return err.annotate("verify step " + std::to_string(step) + ": data file " + at + f.name);
    if (!size.ok()) {  // missing, or not to be read (a symbolic link on local disk)
      file_problem[f.name] = err.data_loss() ? "data file " + at + f.name + " is unreadable: " + err.message()
                                             : "data file " + at + f.name + " is missing";
      sizes[f.name] = 0;
    } else if (*size != f.size) {
      file_problem[f.name] = "data file " + at + f.name + " has " + std::to_string(*size) + " bytes, the index records " +
                             std::to_string(f.size) + (*size < f.size ? " (short file)" : " (longer than recorded)");
      sizes[f.name] = *size;
    } else {
      sizes[f.name] = *size;
    }
  }
  // Every readable shard, in index order.
  Verifier verifier(step, at);
  std::vector<ExecRead> reads;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& leaf : p.leaves)
      for (size_t i = 0; i < leaf.shards.size(); ++i) {
        const ShardRecord& rec = leaf.shards[i];
        const ShardCheck s{&p, &leaf, i};
        if (rec.length > 0 && rec.offset + rec.length > sizes[rec.file]) {
          lost[rec.file].push_back(verifier.where(s));
          continue;
        }
        if (rec.length == 0) {  // nothing to read: the checksum of no bytes
          if (rec.crc32c != 0) verifier.note("checksum mismatch in " + verifier.where(s));
          continue;
        }
        verifier.add(s, ordinal[rec.file], &reads);
      }
  verifier.set_reads(&reads);
  uint64_t to_read = 0;
  for (const ExecRead& r : reads) to_read += r.length;
  ProgressReport progress(on_progress, to_read);
  verifier.set_progress(&progress);
  ReadExecutorLimits limits;
  limits.batch_bytes = kStagingBytes;
  limits.staging_bytes = kStagingBytes;
  limits.align = std::max<uint64_t>(storage_->read_alignment(), 1);
  CKPTIO_RETURN_IF_ERROR(
      execute_reads(*storage_, keys, &reads, verifier, limits, "verify step " + std::to_string(step)));
  progress.finish();

  // Files named before shards: they are usually the cause.
  std::vector<std::string> file_lines;
  for (const auto& [name, problem] : file_problem) {
    std::string line = problem;
    auto it = lost.find(name);
    if (it != lost.end()) {
      line += ", losing " + std::to_string(it->second.size()) + " shard(s): ";
      for (size_t k = 0; k < it->second.size() && k < 3; ++k) line += (k ? ", " : "") + it->second[k];
      if (it->second.size() > 3) line += ", ...";
    }
    file_lines.push_back(std::move(line));
  }
  // A file of the recorded size never loses shards (the index checks every
  // shard lies inside its file's recorded size), so `lost` has no others.
  const std::vector<std::string>& problems = verifier.problems();
  const size_t count = verifier.count();
  if (file_lines.empty() && count == 0) return Status::OK();
  std::string msg = "verify step " + std::to_string(step) + " at " + at + ": " +
                    std::to_string(file_lines.size() + count) + " problem(s): ";
  size_t shown = 0;
  for (const std::string& l : file_lines) msg += (shown++ ? "; " : "") + l;
  for (const std::string& l : problems) msg += (shown++ ? "; " : "") + l;
  if (count > problems.size()) msg += "; ... and " + std::to_string(count - problems.size()) + " more";
  return data_loss(msg);
}

}  // namespace ckptio
