// copy_step / copy_all_steps (include/ckptio/copy.h): which step, what the
// destination already holds, then one attempt of the destination's own
// commit protocol.
//
// A copy is a save whose bytes come from another storage instead of the
// caller's memory, so it takes the same path through src/save/commit.cc:
// plan_attempt() picks the attempt id and, from dst.caps(), where the data
// goes (<step>.tmp-<attempt>/ on POSIX, <step>/ on object stores); the data
// files get attempt-unique names data-<attempt>-<n>.bin (n = position in the
// source index's `files`), the index is rewritten to name them
// (copy_index.cc) before any byte moves, the data is streamed and made
// durable (copy_stream.cc), and commit_attempt() makes the step visible
// (rename, or the index PUT last). Any failure runs discard_attempt(), which
// never touches a committed step's objects.
#include <chrono>
#include <filesystem>
#include <new>

#include "src/util/callback.h"
#include "src/save/commit.h"
#include "src/copy/convert.h"
#include "src/copy/copy.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/layout/layout.h"
#include "src/storage/own_objects.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kDefaultMaxMemory = 256ull << 20;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Namings {
  StepNaming src, dst;
};

Result<Namings> make_namings(const CopyOptions& o) {
  auto src = StepNaming::make(o.src_step_format);
  if (!src.ok()) return src.status().annotate("source");
  auto dst = StepNaming::make(o.dst_step_format);
  if (!dst.ok()) return dst.status().annotate("destination");
  return Namings{std::move(src).value(), std::move(dst).value()};
}

// The chunk size and memory bound of a copy into `dst`; at least two chunks
// must fit (one being read while one is written).
Status plan_buffers(const Storage& dst, const CopyOptions& o, uint64_t* chunk, uint64_t* memory) {
  *chunk = copy_chunk_size(dst, o.chunk_size);
  *memory = o.max_memory ? o.max_memory : kDefaultMaxMemory;
  if (*memory / *chunk >= 2) return Status::OK();
  return invalid_argument("copy memory bound of " + std::to_string(*memory) +
                          " bytes holds fewer than two chunks of " + std::to_string(*chunk) +
                          " bytes (the chunk size rounded up to a multiple of " + dst.describe() +
                          "'s write unit, " + std::to_string(dst.write_granularity()) + " bytes)");
}

// Committed steps of `storage` (a final step directory with an index object;
// the index is not parsed here), ascending.
Result<std::vector<int64_t>> steps_with_index(Storage& storage, const StepNaming& naming) {
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(storage, naming));
  std::vector<int64_t> steps;
  for (const StepDir& d : dirs) {
    if (d.kind != StepDirKind::kFinal) continue;
    auto st = storage.stat(index_key(d.name));
    if (st.ok()) steps.push_back(d.step);
    else if (st.status().code() != Code::kNotFound) return st.status();
    if (st.ok()) continue;
    // Complete eformer steps count too, and damaged ones (read_source then
    // reports the damage: never passed over in silence).
    auto eformer = zarr::load_eformer_step(storage, d.name, d.step);
    if (eformer.ok() ? eformer->has_value() : eformer.status().data_loss()) steps.push_back(d.step);
    else if (!eformer.ok() && eformer.status().code() != Code::kNotFound)  // (incomplete: not a step)
      return eformer.status().annotate("read " + storage.describe() + "/" + d.name);
  }
  return steps;
}

struct SourceStep {
  std::string dir;
  std::string text;
  Index index;
};

Result<SourceStep> read_source(Storage& src, const StepNaming& naming, int64_t step) {
  SourceStep s;
  s.dir = naming.name(step);
  const std::string key = index_key(s.dir);
  auto text = get_own_object(src, key, IndexLimits{}.max_bytes);
  if (!text.ok() && text.status().code() == Code::kNotFound) {  // a step eformer wrote?
    auto eformer = zarr::load_eformer_step(src, s.dir, step);
    if (eformer.ok() && eformer->has_value()) {
      s.index = std::move(**eformer);
      return s;
    }
    if (!eformer.ok() && eformer.status().code() != Code::kNotFound) return eformer.status();
  }
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound)
      return not_found("step " + std::to_string(step) + " is not committed at " + src.describe() +
                       " (no " + key + ")");
    return text.status().annotate("read " + src.describe() + "/" + key);
  }
  auto index = parse_index(*text);
  if (!index.ok()) return index.status().annotate(src.describe() + "/" + key);
  if (index->step != step)
    return data_loss(src.describe() + "/" + key + ": the index records step " +
                     std::to_string(index->step) + ", not " + std::to_string(step));
  s.text = std::move(text).value();
  s.index = std::move(index).value();
  return s;
}

enum class AtDestination { kAbsent, kIdentical, kDifferent, kDamaged };

struct DestinationState {
  AtDestination what = AtDestination::kAbsent;
  std::string why;  // kDamaged: the parse error
  bool eformer = false;  // a step in eformer's layout (no ckptio index)
};

// Where a step directory is, as text: the storage's location (a local path
// lexically normalized) and the directory.
std::string location_of(const Storage& s, const std::string& dir) {
  std::string base = s.describe();
  if (!base.empty() && base.front() == '/') base = std::filesystem::path(base).lexically_normal().string();
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/" + dir;
}

// One step directory inside the other (`cp /x/run-5 /x --step 5`: the
// source's location is the destination's step directory): the commit would
// replace (with overwrite: delete) or fill the directory being read. Before,
// an overwrite swapped the whole source location out and deleted it. The same
// directory is no nesting: a copy onto itself reads the source whole first.
Status refuse_nested(const Storage& src, const std::string& src_dir, const Storage& dst, const std::string& dst_dir) {
  const std::string a = location_of(src, src_dir), b = location_of(dst, dst_dir);
  auto inside = [](const std::string& in, const std::string& out) {
    return in.size() > out.size() && in.compare(0, out.size(), out) == 0 && in[out.size()] == '/';
  };
  if (inside(a, b))
    return invalid_argument("cannot copy " + a + " to " + b + ": the source lies inside the destination's step "
                            "directory, which the copy replaces");
  if (inside(b, a))
    return invalid_argument("cannot copy " + a + " to " + b + ": the destination lies inside the source's step "
                            "directory");
  return Status::OK();
}

Result<DestinationState> inspect_destination(Storage& dst, const std::string& dir, const Index& src) {
  auto text = get_own_object(dst, index_key(dir), IndexLimits{}.max_bytes);
  if (!text.ok()) {
    if (text.status().data_loss()) return DestinationState{AtDestination::kDamaged, text.status().message()};
    if (text.status().code() != Code::kNotFound)
      return text.status().annotate("read " + dst.describe() + "/" + index_key(dir));
    // A step eformer wrote is as committed as one with an index (an object
    // store's index PUT would not see it, and would shadow it).
    auto eformer = zarr::load_eformer_step(dst, dir, src.step);
    if (eformer.ok() && eformer->has_value()) return DestinationState{AtDestination::kDifferent, "", true};
    if (!eformer.ok() && eformer.status().data_loss())
      return DestinationState{AtDestination::kDamaged, eformer.status().message(), true};
    if (!eformer.ok() && eformer.status().code() != Code::kNotFound)
      return eformer.status().annotate("read " + dst.describe() + "/" + dir);
    return DestinationState{};
  }
  auto index = parse_index(*text);
  if (!index.ok()) return DestinationState{AtDestination::kDamaged, index.status().to_string()};
  return DestinationState{same_step(src, *index) ? AtDestination::kIdentical : AtDestination::kDifferent, ""};
}

std::string already_there(Storage& dst, const std::string& dir, int64_t step,
                          const DestinationState& d) {
  std::string s = "step " + std::to_string(step) + " is already committed at " + dst.describe() +
                  "/" + dir;
  if (d.what == AtDestination::kIdentical) s += " (the same step)";
  if (d.eformer) s += " in the eformer layout";
  if (d.what == AtDestination::kDifferent && !d.eformer) s += " with different contents";
  if (d.what == AtDestination::kDamaged) s += d.eformer ? " and damaged (" + d.why + ")" : " with a damaged index (" + d.why + ")";
  return s;
}

// The attempt: stream, commit, or discard.
Result<CopyStats> copy_attempt(Storage& src, Storage& dst, const Namings& names,
                               const SourceStep& s, const CopyOptions& o) {
  CopyStats stats;
  stats.step = s.index.step;
  const std::string what = "step " + std::to_string(stats.step);
  const AttemptPaths paths = plan_attempt(dst, names.dst.name(stats.step));

  std::map<std::string, std::string> renames;
  std::vector<std::string> dst_files;
  StreamPlan plan;
  plan.what = what;
  for (size_t i = 0; i < s.index.files.size(); ++i) {
    dst_files.push_back(data_file_name(paths.attempt, static_cast<int>(i)));
    renames[s.index.files[i].name] = dst_files.back();
    plan.src_keys.push_back(s.dir + "/" + s.index.files[i].name);
    plan.dst_keys.push_back(paths.stage_dir + "/" + dst_files.back());
  }
  CKPTIO_ASSIGN_OR_RETURN(std::string index_text, rewrite_index_text(s.text, s.index, renames));
  CKPTIO_RETURN_IF_ERROR(plan_buffers(dst, o, &plan.chunk, &plan.max_memory));
  uint64_t total = 0;  // for progress; saturates (a hostile index fails on reading)
  for (const auto& f : s.index.files)
    if (__builtin_add_overflow(total, f.size, &total)) total = UINT64_MAX;
  if (o.on_progress)  // what it throws stops the copy as an error would
    plan.on_progress = [&](uint64_t done) {
      return call_callback("on_progress", [&] { o.on_progress(stats.step, done, total); }).annotate(what);
    };

  const auto t0 = Clock::now();
  bool outcome_unknown = false;
  Status st;
  try {  // what it throws (std::bad_alloc) discards the attempt too
    st = plan.on_progress ? plan.on_progress(0) : Status::OK();
    StreamResult streamed;
    if (st.ok()) {
      auto r = stream_data_files(src, dst, s.index, plan);
      st = r.status();
      if (r.ok()) streamed = *r;
    }
    stats.data_seconds = seconds_since(t0);
    if (st.ok()) {
      stats.bytes = streamed.bytes;
      stats.shards = streamed.shards;
      stats.files = s.index.files.size();
      const auto t1 = Clock::now();
      st = commit_attempt(dst, paths, index_text, o.overwrite, &outcome_unknown);
      stats.commit_seconds = seconds_since(t1);
    }
  } catch (...) {
    if (!outcome_unknown) discard_attempt_nothrow(dst, paths, dst_files);
    throw;
  }
  if (!st.ok()) {
    if (!outcome_unknown) discard_attempt(dst, paths, dst_files);  // (else gc's, if not committed)
    return st;
  }
  return stats;
}

Result<CopyStats> copy_one(Storage& src, Storage& dst, const Namings& names, int64_t step,
                           const CopyOptions& o) {
  const auto t0 = Clock::now();
  CKPTIO_ASSIGN_OR_RETURN(SourceStep s, read_source(src, names.src, step));
  const std::string dir = names.dst.name(step);
  CKPTIO_RETURN_IF_ERROR(refuse_nested(src, s.dir, dst, dir));
  CKPTIO_ASSIGN_OR_RETURN(DestinationState d, inspect_destination(dst, dir, s.index));
  CopyStats stats;
  stats.step = step;
  const std::string layout = o.format.empty() ? s.index.layout : o.format;
  if (layout != "ckptio" || s.index.layout != "ckptio") {  // decode and encode (convert.h)
    if (layout == "ckptio" && d.what != AtDestination::kAbsent && !o.overwrite)
      return Status(Code::kAlreadyExists, already_there(dst, dir, step, d) + " (pass overwrite to replace it)");
    CKPTIO_ASSIGN_OR_RETURN(stats, convert_step(src, s.dir, s.index, dst, dir, layout, o));
  } else if (d.what == AtDestination::kIdentical && o.skip_identical) {
    stats.skipped = true;
  } else if (d.what != AtDestination::kAbsent && !o.overwrite) {
    return Status(Code::kAlreadyExists, already_there(dst, dir, step, d) + " (pass overwrite to replace it)");
  } else {
    CKPTIO_ASSIGN_OR_RETURN(stats, copy_attempt(src, dst, names, s, o));
  }
  stats.seconds = seconds_since(t0);
  if (o.on_step)  // the step is at DST whatever it throws; a copy of all steps stops
    CKPTIO_RETURN_IF_ERROR(call_callback("on_step", [&] { o.on_step(stats); })
                               .annotate("step " + std::to_string(step) + " was copied, then"));
  return stats;
}

std::string join_steps(const std::vector<int64_t>& steps) {
  std::string s;
  for (size_t i = 0; i < steps.size() && i < 20; ++i) s += (i ? ", " : "") + std::to_string(steps[i]);
  if (steps.size() > 20) s += ", ... (" + std::to_string(steps.size()) + " in all)";
  return s;
}

Status check_format(const CopyOptions& o) {
  if (o.format.empty() || o.format == "ckptio" || o.format == zarr::kEformerLayout) {
    if (o.zstd_level < -7 || o.zstd_level > 22)
      return invalid_argument("copy: zstd level " + std::to_string(o.zstd_level) + " is outside [-7, 22]");
    return Status::OK();
  }
  return invalid_argument("copy: unknown format \"" + o.format + "\" (ckptio or eformer)");
}

Result<CopyStats> copy_step_impl(Storage& src, Storage& dst, std::optional<int64_t> step,
                                 const CopyOptions& o) {
  CKPTIO_RETURN_IF_ERROR(check_format(o));
  CKPTIO_ASSIGN_OR_RETURN(Namings names, make_namings(o));
  uint64_t chunk = 0, memory = 0;
  CKPTIO_RETURN_IF_ERROR(plan_buffers(dst, o, &chunk, &memory));
  if (!step) {
    CKPTIO_ASSIGN_OR_RETURN(auto steps, steps_with_index(src, names.src));
    if (steps.empty()) return not_found("no committed step at " + src.describe());
    step = steps.back();
  }
  if (*step < 0) return invalid_argument("step must be >= 0, got " + std::to_string(*step));
  auto stats = copy_one(src, dst, names, *step, o);
  if (!stats.ok())
    return stats.status().annotate("copy step " + std::to_string(*step) + " from " + src.describe() +
                                   " to " + dst.describe());
  return stats;
}

Result<std::vector<CopyStats>> copy_all_impl(Storage& src, Storage& dst, const CopyOptions& options) {
  CopyOptions o = options;
  o.skip_identical = true;
  CKPTIO_RETURN_IF_ERROR(check_format(o));
  CKPTIO_ASSIGN_OR_RETURN(Namings names, make_namings(o));
  uint64_t chunk = 0, memory = 0;
  CKPTIO_RETURN_IF_ERROR(plan_buffers(dst, o, &chunk, &memory));
  CKPTIO_ASSIGN_OR_RETURN(auto steps, steps_with_index(src, names.src));
  if (steps.empty()) return not_found("no committed step at " + src.describe());

  // Plan first, so that a damaged source or a conflict stops the copy before
  // any byte moves. Indexes are read again when each step is copied (holding
  // every index at once could take a lot of memory).
  std::vector<std::string> damaged;
  std::vector<int64_t> conflicts;
  for (int64_t step : steps) {
    auto s = read_source(src, names.src, step);
    if (!s.ok()) {
      if (!s.status().data_loss()) return s.status().annotate("copy: step " + std::to_string(step));
      damaged.push_back(s.status().message());
      continue;
    }
    CKPTIO_ASSIGN_OR_RETURN(DestinationState d, inspect_destination(dst, names.dst.name(step), s->index));
    if (d.what == AtDestination::kDifferent || d.what == AtDestination::kDamaged) conflicts.push_back(step);
  }
  if (!damaged.empty()) {
    std::string msg = "copy nothing: " + std::to_string(damaged.size()) + " damaged source step" +
                      (damaged.size() == 1 ? "" : "s");
    for (const std::string& m : damaged) msg += "; " + m;
    return data_loss(msg);
  }
  if (!conflicts.empty() && !o.overwrite)
    return Status(Code::kAlreadyExists,
                  "copy nothing: step" + std::string(conflicts.size() == 1 ? " " : "s ") +
                      join_steps(conflicts) + (conflicts.size() == 1 ? " is" : " are") +
                      " already committed at " + dst.describe() +
                      " with different contents (pass overwrite to replace them)");

  std::vector<CopyStats> out;
  std::vector<int64_t> copied;
  for (int64_t step : steps) {
    auto stats = copy_one(src, dst, names, step, o);
    if (!stats.ok()) {
      std::string context = "copy step " + std::to_string(step) + " from " + src.describe() + " to " +
                            dst.describe();
      if (!copied.empty()) context += " (step" + std::string(copied.size() == 1 ? " " : "s ") +
                                      join_steps(copied) + " copied before it)";
      return stats.status().annotate(context);
    }
    if (!stats->skipped) copied.push_back(step);
    out.push_back(*stats);
  }
  return out;
}

}  // namespace

Result<CopyStats> copy_step(Storage& src, Storage& dst, std::optional<int64_t> step,
                            const CopyOptions& options) {
  try {
    return copy_step_impl(src, dst, step, options);
  } catch (const std::bad_alloc&) {
    return out_of_memory("copy");
  } catch (const std::exception& e) {  // thread creation; nothing else throws
    return internal_error(std::string("copy: ") + e.what());
  }
}

Result<std::vector<CopyStats>> copy_all_steps(Storage& src, Storage& dst, const CopyOptions& options) {
  try {
    return copy_all_impl(src, dst, options);
  } catch (const std::bad_alloc&) {
    return out_of_memory("copy");
  } catch (const std::exception& e) {
    return internal_error(std::string("copy: ") + e.what());
  }
}

}  // namespace ckptio
