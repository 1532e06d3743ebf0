// The storage seam: the one interface between ckptio's core and the places
// bytes live (local disk through io_uring, S3-compatible object stores, memory).
//
// A backend knows keys and byte ranges; it never knows what a leaf is. Keys are
// '/'-separated paths relative to the backend's root ("run-5/index.json"). A key
// never starts with '/', never contains "..", NUL or backslash.
//
// Thread safety: every Storage method may be called from any thread
// concurrently. A WritableObject is used by one thread at a time; its
// completion callbacks run on a backend thread and must be quick (no I/O, no
// blocking): they typically decrement a counter and signal a condition.
//
// Missing objects: get(), stat() and read() return Code::kNotFound; remove()
// and remove_prefix() of something missing succeed (they are idempotent).
//
// Errors: Status values only; no exception escapes a backend. Transient faults
// come back as Code::kUnavailable (retryable()); a backend that retries
// internally returns the last error when it gives up.
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <typeindex>
#include <vector>

#include "ckptio/status.h"

namespace ckptio {

using IoDone = std::function<void(Status)>;

// What the core may rely on; it picks its commit protocol from these.
struct StorageCaps {
  // rename() of a prefix is atomic (POSIX directories). Without it the core
  // commits by writing the index object last (object stores).
  bool atomic_rename = false;
  // rename() with RenameMode::kExchange swaps two prefixes atomically.
  bool atomic_exchange = false;
};

// One object being written in ranges (a local file through the ring, or an
// S3 multipart upload whose parts are the ranges).
//
// Contract for write_async(): ranges do not overlap; every offset is a multiple
// of granularity(); every length is a multiple of granularity() except for the
// range that ends the object. The data pointer is aligned to the storage's
// write_memory_alignment() (the core's staging buffers are 4096-aligned; a
// borrow-mode save writes the caller's memory in place, see below) and must
// stay valid until `done` runs. The length may exceed the final size by
// padding up to the next multiple of alignment(); finish() trims the object
// to `final_size`.
//
// Exceptions: write_async() either accepts the range, and then calls `done`
// exactly once (possibly before it returns, on the caller's thread), or it
// throws (std::bad_alloc where the system refuses memory) having accepted
// nothing: `done` is not called and the object is as it was. A range the
// backend could only partly queue (its first pieces in flight, memory refused
// for the rest) is accepted and fails through `done` (kResourceExhausted),
// once its queued pieces completed; finish() then fails too.
//
// `done` runs on a backend thread (the ring's, the HTTP loop's) or the
// caller's, and must not throw: it records its status without failing for
// want of memory (a Status copy that allocates goes through
// status_or_out_of_memory, containers it fills are reserved).
class WritableObject {
 public:
  virtual ~WritableObject() = default;
  // Bytes that offsets and lengths must be multiples of (1 = any).
  virtual uint64_t granularity() const = 0;
  // Padding unit for the last range (4096 for O_DIRECT, else 1).
  virtual uint64_t alignment() const = 0;
  virtual void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) = 0;
  // Waits for every queued write, trims to `final_size`, and makes the object
  // durable (fsync / CompleteMultipartUpload). Any earlier write error, or an
  // fsync error, is returned and the object must be treated as lost.
  virtual Status finish(uint64_t final_size) = 0;
  // Drops the object (after waiting for queued writes). Never fails loudly.
  virtual void abort() = 0;
  // For a caller that will abort the object anyway (another object of the
  // save failed): writes queued and not yet begun fail (kCancelled) instead
  // of being sent, and a failed one is not retried, so that abort() does not
  // wait for each to spend its retries. Any thread; abort() or finish()
  // still follow. The default does nothing (local writes do not wait long).
  virtual void cancel() noexcept {}
};

struct ReadRequest {
  std::string key;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::byte* dst = nullptr;  // caller-owned, `length` bytes
};

struct ListEntry {
  std::string key;
  uint64_t size = 0;
  // Last change, ns since the Unix epoch: the file's mtime, the object's
  // LastModified, or for an unfinished upload when it began; 0 if the
  // backend does not know (gc counts that as old).
  int64_t modified_unix_ns = 0;
};

struct ListResult {
  std::vector<ListEntry> objects;       // keys directly matched
  std::vector<std::string> prefixes;    // with a delimiter: "run-5/" style groups
};

// One version of an object, open for reads at any offset: every read sees
// the bytes of the object as it was opened, even if its key is replaced
// meanwhile (a local file's descriptor). Storage::open makes one.
class ObjectReader {
 public:
  virtual ~ObjectReader() = default;
  virtual uint64_t size() const = 0;
  // Exactly `length` bytes at `offset` into dst; past the end is kDataLoss.
  // Reads of distinct ranges may run on different threads at once.
  virtual Status read(uint64_t offset, uint64_t length, std::byte* dst) = 0;
  // The whole object, when the reader holds it in memory already (read()
  // then copies out of it): a caller that wants all of it uses it in place.
  virtual std::optional<std::string_view> in_memory() const { return std::nullopt; }
};

// A read-only view of a whole object, made without reading it into memory
// of the caller's (Storage::view_cached). Valid while the view lives.
class ObjectView {
 public:
  virtual ~ObjectView() = default;
  virtual std::span<const std::byte> bytes() const = 0;
};

enum class RenameMode {
  kNoReplace,  // fail with kAlreadyExists if `to` exists
  kExchange,   // atomically swap `from` and `to` (both must exist)
};

class Storage {
 public:
  virtual ~Storage() = default;

  virtual StorageCaps caps() const = 0;
  // A printable location for messages ("/data/ckpt", "s3://bucket/prefix").
  virtual std::string describe() const = 0;

  // Starts a new object at `key` (replacing nothing until finish()).
  virtual Result<std::unique_ptr<WritableObject>> create(const std::string& key,
                                                          uint64_t size_hint) = 0;

  // As create(), for a key the caller promises holds no object (a name
  // unique to one save attempt): there is nothing to replace, so the backend
  // may make the object visible before finish(), and abort() removes it
  // again. Only what is committed by an index is ever read, so a save's
  // data files are created this way: S3 then PUTs an object of one part as
  // soon as its one range arrives, in parallel with the others, instead of
  // copying it and PUTting it in finish(). The default is create().
  virtual Result<std::unique_ptr<WritableObject>> create_new(const std::string& key, uint64_t size_hint) {
    return create(key, size_hint);
  }

  // Writes a small whole object atomically and durably (the index): readers
  // see the old object or the new one, never a mix.
  virtual Status put(const std::string& key, std::span<const std::byte> data) = 0;
  // As put(), for a key that must hold no object yet (a step's index on an
  // object store, where no rename can refuse to replace a step): when one is
  // there, kAlreadyExists and nothing written. Atomic against concurrent
  // put_new()s of the same key on the backends here: local (rename with
  // RENAME_NOREPLACE), memory (under its lock), S3 (If-None-Match: *, which
  // AWS S3, MinIO, Ceph RGW and moto honour; a server that ignores the
  // header, as s3rver 3.7 does, replaces the object like put()). The default
  // stat()s, then put()s: not atomic.
  virtual Status put_new(const std::string& key, std::span<const std::byte> data);

  // Reads a whole small object; fails with kInvalidArgument above `max_size`.
  virtual Result<std::string> get(const std::string& key, uint64_t max_size) = 0;

  virtual Result<uint64_t> stat(const std::string& key) = 0;

  // Opens a whole small object (at most `max_size` bytes, else
  // kInvalidArgument; kNotFound when absent) for reads in parts, so that a
  // large index can be parsed while its end is still being read. The
  // default reads it whole with get() and serves the parts from memory.
  virtual Result<std::unique_ptr<ObjectReader>> open(const std::string& key, uint64_t max_size);

  // Reads every request (in parallel where the backend can). Returns the first
  // error, naming the key; a read past the end of an object is kDataLoss.
  virtual Status read(std::span<const ReadRequest> requests) = 0;

  // The object `key` in place, when the backend holds it in memory already
  // and can lend it without a copy: on local disk a read-only mapping of a
  // file whose pages the page cache holds (at least 90% of them; never with
  // direct_io "on"). nullptr otherwise (object stores, memory, wrappers such
  // as the fault injector: read() it instead). For a caller that reads each
  // byte once (a conversion compressing a cached step): no copy out of the
  // cache and no memory of its own to fault in. The bytes are the object's
  // as they are now; a file truncated while viewed raises SIGBUS on access
  // past its new end, so this is for objects nobody rewrites (committed data
  // files). kNotFound when absent.
  virtual Result<std::unique_ptr<ObjectView>> view_cached(const std::string& key) {
    (void)key;
    return std::unique_ptr<ObjectView>();
  }

  // The granularity() every WritableObject of this backend will report (an
  // object store's part size; 1 or 4096 locally). The core cuts its save
  // chunks to a multiple of it before it creates the object.
  virtual uint64_t write_granularity() const { return 1; }

  // The alignment write_async() needs of its data pointer (a power of two,
  // at most 4096): 4096 for O_DIRECT files, 1 where the bytes are copied or
  // sent from any address (buffered files, object stores). A borrow-mode
  // save pads each large shard's file offset to agree with its address
  // modulo this value so that it can be written in place; 1 means no padding
  // at all. The default is the safe one (4096 whenever writes are coarse);
  // backends that take any address say so, and wrappers forward it.
  virtual uint64_t write_memory_alignment() const { return write_granularity() > 1 ? 4096 : 1; }

  // The size a save aims to keep each data file within, 0 for no bound (one
  // data file per process and step). A save cuts its data into files at shard
  // boundaries so that each holds at most this many bytes, unless one shard
  // alone is larger (it then gets a file of its own). Object stores set it to
  // one part: each data object is then a single PutObject (no multipart
  // upload to create and complete, which some servers pay for by copying
  // every byte again), and a restore reads whole objects. Wrappers forward it.
  virtual uint64_t data_object_bytes() const { return 0; }

  // The alignment at which destination addresses and offsets should agree
  // (modulo this value) for zero-copy reads; 1 when it does not matter.
  virtual uint64_t read_alignment() const { return 1; }

  // Lists keys starting with `prefix`. With `delimiter`, keys that have a '/'
  // after the prefix are grouped into `prefixes` (S3 ListObjectsV2 semantics).
  virtual Result<ListResult> list(const std::string& prefix, bool delimiter) = 0;

  virtual Status remove(const std::string& key) = 0;
  virtual Status remove_prefix(const std::string& prefix) = 0;

  // Renames every key under prefix `from` to prefix `to` (both end in '/').
  // Only when caps().atomic_rename; kUnimplemented otherwise.
  virtual Status rename(const std::string& from, const std::string& to, RenameMode mode) {
    (void)from; (void)to; (void)mode;
    return Status(Code::kUnimplemented, describe() + ": rename is not supported");
  }

  // Object stores: writes begun and never finished or aborted (S3 multipart
  // uploads) whose key starts with `prefix`, one entry per key (size 0,
  // modified_unix_ns = when the newest of them began), sorted by key. Empty
  // for backends whose unfinished writes are ordinary objects that list()
  // already shows.
  virtual Result<std::vector<ListEntry>> list_unfinished(const std::string& prefix) {
    (void)prefix;
    return std::vector<ListEntry>{};
  }
  // The newest change under `prefix` (ns since the Unix epoch): of the
  // objects, of unfinished writes, and where directories exist, of the
  // directories (an entry added or removed). nullopt when nothing is there.
  // gc uses it to leave alone what a live save elsewhere may still be
  // writing. The default takes list() and list_unfinished().
  virtual Result<std::optional<int64_t>> newest_change(const std::string& prefix);
  // Drops every unfinished write of `key` (idempotent).
  virtual Status abort_unfinished(const std::string& key) { (void)key; return Status::OK(); }

  // Makes the entries directly under `prefix` durable (fsync of a directory;
  // "" is the root). A no-op where puts are durable on return.
  virtual Status sync(const std::string& prefix) { (void)prefix; return Status::OK(); }
};

// The key rules above, for backends to enforce (kInvalidArgument naming the
// key): relative, no NUL, backslash or "..", no empty or "." components, no
// trailing '/'. A prefix may be empty or end in '/'.
Status check_storage_key(std::string_view key);
Status check_storage_prefix(std::string_view prefix);

// Options of the backend a URI opens. Each backend declares its own options
// in its public header (ckptio/local.h: LocalOptions, ckptio/s3.h:
// S3Options) and reads them from here by type; a backend whose options were
// never set gets their defaults. A value type: copies are independent.
//
//   StorageOptions o;
//   o.get<S3Options>().endpoint = "http://127.0.0.1:9000";
//   auto storage = open_storage("s3://bucket/run7", o);
class StorageOptions {
 public:
  // The options of type T, created with T's defaults on first use.
  template <class T>
  T& get() {
    std::any& a = by_type_[std::type_index(typeid(T))];
    if (!a.has_value()) a = T{};
    return std::any_cast<T&>(a);
  }
  // The options of type T as set, or T's defaults.
  template <class T>
  T get_or_default() const {
    auto it = by_type_.find(std::type_index(typeid(T)));
    return it == by_type_.end() ? T{} : std::any_cast<const T&>(it->second);
  }

 private:
  std::map<std::type_index, std::any> by_type_;
};

// The backend registry: the one place that maps a URI to a backend. The core
// opens every URI through it and names no backend; each backend registers
// its scheme(s) as the library is loaded (backends/*/register.cc), and the
// ckptio::ckptio CMake target links every built-in backend in whole, so a
// program linked against it finds local paths and file://, s3:// and mem://.
//
// An opener gets the whole URI and the options, and returns the storage or
// the error a user should see (kInvalidArgument for a malformed URI).
using StorageOpener =
    std::function<Result<std::shared_ptr<Storage>>(const std::string& uri, const StorageOptions& options)>;

// Registers the backend of URIs "<scheme>://..."; the scheme "" is the
// backend of plain paths (no "://"). kAlreadyExists when the scheme is taken.
// Thread-safe.
Status register_storage(const std::string& scheme, StorageOpener opener);

// A backend's registration as its library loads, in the spirit of
// TensorStore's DriverRegistration: a namespace-scope object
//   const StorageRegistration registration({"s3"}, open_s3);
// registers each scheme with the opener. A scheme taken already (two
// backends for one scheme linked into one program: a build error) is
// reported on stderr and the program aborts.
struct StorageRegistration {
  StorageRegistration(std::initializer_list<const char*> schemes, StorageOpener opener);
};

// The schemes registered so far, sorted ("" for plain paths first).
std::vector<std::string> registered_storage_schemes();

// Opens the backend for `uri` through the registry: a plain path or
// file:///path (local disk), s3://bucket[/prefix] (an S3-compatible object
// store), mem://NAME (an in-process store shared by name, for tests), or
// whatever else was registered. kInvalidArgument for an empty URI or one
// whose scheme no backend registered (the message lists those that are).
// In a program built without the S3 backend (the CLI, the Python package)
// the first s3:// URI loads it from its module, ckptio_s3_backend.so
// (docs/architecture.md, "Backends loaded on demand"); kUnimplemented,
// naming where it looked, when that fails.
Result<std::shared_ptr<Storage>> open_storage(const std::string& uri,
                                              const StorageOptions& options = {});

}  // namespace ckptio
