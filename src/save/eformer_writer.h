// Writing one step in eformer's layout (zarr v2 with TensorStore's
// conventions; eformer_step.h reads it, docs/format.md section 7), keeping
// ckptio's commit promise: after commit() returns OK the step is complete
// and durable; before, and after any failure, no reader sees it as a step.
//
//   <final>/model/layers/0/kernel/.zarray   make_zarray + serialize_zarray (fill_value null)
//   <final>/model/layers/0/kernel/0.0       one chunk: the encoded C-order bytes of the full
//                                           chunk box (edge chunks padded with zeros)
//   <final>/tensorstore_index.json          serialize_eformer_index, prefixes in declaration order
//   <final>/metadata.json                   {"step", "timestamp", "is_temporary", extra members}
//
// Commit protocol (src/save/commit.cc's, with metadata.json, the reader's
// commit marker, in the role of ckptio's index):
//   POSIX (caps().atomic_rename): everything goes under
//     <final>.tmp-<attempt> (layout.h's naming: discovery and gc treat it as
//     a temporary); commit() waits for every chunk (WritableObject::finish
//     made each durable), checks the grid is covered, puts the index,
//     fsyncs every directory the step created (Storage::sync), puts
//     metadata.json, then renames the directory to <final> (RENAME_NOREPLACE,
//     or RENAME_EXCHANGE with overwrite: no moment without a complete step)
//     and fsyncs its parent. A failure removes the temporary directory.
//   Object stores: everything goes to <final> directly, metadata.json last
//     (put_new without overwrite, so that of two writers one fails). A step
//     without metadata.json is "in progress" for the reader, never damage.
//     A failure removes the step's prefix; metadata.json is never written
//     unless every other object is durable. With overwrite the old step is
//     removed when start() runs (metadata.json first): an object store has
//     no atomic replacement of a directory, so between start() and commit()
//     there is no step at that name.
// start() refuses (kAlreadyExists) a final directory holding anything,
// unless overwrite.
//
// Pipeline: write_box() cuts a box into chunks, copying each chunk's bytes
// into a buffer of its own (so `bytes` may be reused once it returns), and
// queues it (write_box_borrowed() queues a chunk that is one run of `bytes`
// as a view instead: no copy, and the caller keeps `bytes` until
// wait_borrowed()); `threads` encoders (one ChunkEncoder each) compress
// straight into aligned, pooled buffers that the writes use as they are, and
// `io_threads` writers create each chunk object (Storage::create_new: the
// keys are new), write it in one range and finish() it. The chunk buffers
// queued and the encoded chunks not yet written hold at most
// max_pending_bytes (a borrowed chunk counts as if copied), plus,
// transiently, the buffer each encoder compresses into, and one chunk when a
// single chunk is larger than the bound; write_box() blocks while they are
// over it. Buffers done with are pooled for the next chunks, up to half of
// max_pending_bytes. Memory use is therefore about 1.5 * max_pending_bytes
// + threads * chunk size.
//
// Timestamps: metadata.json's "timestamp" is the local time without an
// offset, as eformer writes it (dt.datetime.now().isoformat()), so that
// eformer's find_latest_checkpoint can compare it with its own steps' (an
// aware timestamp would not compare with a naive one in Python). ckptio's
// reader takes such a time as UTC.
//
// Errors: argument errors (unknown id, a box that is not a union of whole
// chunks, a chunk written twice, a byte count that does not match) are
// returned by the call and change nothing. The first storage or encoding
// error is kept: later write_box() calls return it at once, queued work is
// dropped, and commit() returns it (naming the key) after removing what was
// written. commit() is final: after it returns, OK or not, the writer takes
// no more calls (kFailedPrecondition). A chunk never written fails commit() with kFailedPrecondition
// naming the array and the chunk.
//
// Thread safety: add_array() and write_box() may be called from any number
// of threads at once; commit() and abort() once, when no other call runs.
// The destructor aborts a writer that was not committed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "ckptio/types.h"
#include "src/layout/zarr/zarray.h"

namespace ckptio::zarr {

// TensorStore's default compressor: zstd, level 1.
inline Compressor zstd_level_1() {
  Compressor c;
  c.id = CodecId::kZstd;
  c.level = 1;
  return c;
}

struct EformerWriteOptions {
  Compressor compressor = zstd_level_1();   // TensorStore's default
  char separator = '.';                      // dimension_separator: '.' or '/'
  unsigned threads = 0;                      // encoding threads; 0 = one per core
  unsigned io_threads = 0;                   // chunk objects written at once; 0 = 16
  uint64_t max_pending_bytes = 256ull << 20; // queued + encoded chunk bytes held at most
  // A JSON object whose members join metadata.json's (EasyDeL adds keys);
  // "step", "timestamp" and "is_temporary" are the writer's own.
  std::string extra_metadata_json = "{}";
  bool is_temporary = false;
  bool overwrite = false;  // replace a step at the final name
  // The attempt's id (its stage directory's name, <final>.tmp-<attempt>):
  // a manager's save passes the one it registered as in flight, which gc
  // spares; "" draws a new one.
  std::string attempt;
};

// The arrays of one step as add_array() checks them, with no writer and no
// storage: a caller that must refuse a state before it touches the storage
// (a conversion that replaces a step on an object store, where the old step
// goes first) lays its leaves out here.
class EformerArrayLayout {
 public:
  EformerArrayLayout(Compressor compressor, char separator) : compressor_(compressor), separator_(separator) {}
  struct Array {
    ZArray z;
    std::string dir;  // "model/layers/0/kernel"
  };
  // What add_array() returns for the leaf (kInvalidArgument), or its array;
  // the leaf is then part of the layout.
  Result<Array> add(const std::string& prefix, const std::string& path, DType dtype, Shape shape, Shape chunks);

 private:
  Compressor compressor_;
  char separator_;
  std::map<std::string, std::string> names_by_dir_;  // "prefix/path" of each array's directory
};

class EformerStepWriter {
 public:
  // A new step `step` whose final directory is `final_dir` ("run-12", a
  // valid storage key). kInvalidArgument for bad options, kAlreadyExists
  // when the final directory holds anything and not overwrite.
  static Result<std::unique_ptr<EformerStepWriter>> start(Storage& storage, std::string final_dir, int64_t step,
                                                          EformerWriteOptions options = {});
  ~EformerStepWriter();
  EformerStepWriter(const EformerStepWriter&) = delete;
  EformerStepWriter& operator=(const EformerStepWriter&) = delete;

  // Declares a leaf: `prefix` ("model"; "" for the index's top-level
  // "arrays"), its dotted key path without the prefix ("layers.0.kernel"),
  // dtype, shape and chunk shape (TensorStore's: the device shard shape).
  // Returns its id (0, 1, ... in declaration order). kInvalidArgument for a
  // '/' in prefix or path, an empty path, a leaf declared twice, an array
  // directory inside another's, or what make_zarray refuses. Queues the
  // array's .zarray.
  Result<size_t> add_array(const std::string& prefix, const std::string& path, DType dtype, Shape shape,
                           Shape chunks);

  // The C-order bytes of `box` of array `id`. The box is a union of whole
  // chunks of the grid, clipped to the shape at the edges (a device shard
  // when chunks = shard shape); an empty box is a no-op. `bytes` is read
  // before the call returns. May block (max_pending_bytes).
  Status write_box(size_t id, const Box& box, std::span<const std::byte> bytes);

  // As write_box, but `bytes` is borrowed: each chunk that is one contiguous
  // run of it (a device shard written as its own box, a row band of a leaf
  // written whole) is compressed straight from it, without write_box's copy.
  // `bytes` must stay valid and unchanged until wait_borrowed() returns
  // (also after an error); chunks that are not one run, and every chunk when
  // the compressor is none, are copied before the call returns.
  Status write_box_borrowed(size_t id, const Box& box, std::span<const std::byte> bytes);

  // Waits until no chunk handed to write_box_borrowed() is read any more:
  // each was encoded, or dropped after an error. Destroying the writer waits
  // too.
  void wait_borrowed();

  // Waits until every chunk and .zarray handed over so far is written and
  // durable (as objects; their names become durable at commit), and returns
  // the first error so far. Commits nothing. Not concurrent with write_box().
  Status flush();

  // Waits for every write, checks every chunk was written, then commits
  // (protocol above). After OK the step is committed and durable; after an
  // error what was written is removed (except, on an object store, when the
  // outcome of the metadata.json PUT itself could not be learned).
  Status commit();

  // Drops everything written (the temporary directory on POSIX; the step's
  // prefix on object stores). Idempotent; a no-op after a successful commit.
  void abort();

  // Where the objects go before commit: <final>.tmp-<attempt> on POSIX, the
  // final directory elsewhere.
  const std::string& stage_dir() const;

 private:
  struct Impl;
  explicit EformerStepWriter(std::unique_ptr<Impl> impl);
  Status write_chunks(size_t id, const Box& box, std::span<const std::byte> bytes, bool borrow);
  std::unique_ptr<Impl> impl_;
};

// `unix_ns` as Python's datetime.isoformat() writes a naive local time (eformer's
// dt.datetime.now().isoformat()): "2025-11-02T10:00:05.123456", without
// ".ffffff" when the microseconds are 0.
std::string python_isoformat_local(int64_t unix_ns);

}  // namespace ckptio::zarr
