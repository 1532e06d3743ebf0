// The data model: dtypes, shapes, boxes, and the leaves a checkpoint holds.
//
// A checkpoint step holds leaves grouped under prefixes ("model", "tx", ...).
// A leaf is named by a dotted path ("params.layers.0.attn.q_proj.kernel"),
// has a dtype and a global shape, and is stored as one or more shards; each
// shard is a box of the global array whose bytes are laid out in C order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckptio {

// Spelled in the index as numpy / JAX spell them (see docs/format.md).
enum class DType : uint8_t {
  kBool,
  kInt8, kInt16, kInt32, kInt64,
  kUInt8, kUInt16, kUInt32, kUInt64,
  kFloat16, kBFloat16, kFloat32, kFloat64,
  kFloat8E4M3FN, kFloat8E5M2,
  kComplex64, kComplex128,
};
inline constexpr int kNumDTypes = 17;

std::string_view dtype_name(DType t);                 // "bfloat16"
std::optional<DType> parse_dtype(std::string_view s);  // nullopt if unknown
size_t dtype_size(DType t);                             // bytes per element
// The address alignment its elements need (its size, 1 to 16: a power of
// two). Saves start each shard at a multiple of it in its data file, and
// restores return leaves that start at a multiple of it.
size_t dtype_alignment(DType t);
bool dtype_is_float(DType t);  // float16/bfloat16/float32/float64 (castable kinds)

using Shape = std::vector<int64_t>;

// A box of an array: [start[d], stop[d]) for every dimension d.
struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> stop;
  static Box whole(const Shape& shape);
  size_t rank() const { return start.size(); }
  Shape extent() const;  // stop - start per dimension
  // Whether the box is [0, shape) in every dimension (no allocation).
  bool is_whole(const Shape& shape) const;
  bool operator==(const Box&) const = default;
};

// Number of elements of a shape, or nullopt if a dimension is negative or
// the product (times itemsize, when given) overflows 64 bits.
std::optional<uint64_t> checked_num_bytes(const Shape& shape, size_t itemsize = 1);
// The same for a box's extent (stop - start), without building it: nullopt
// also when a stop lies before its start or the ranks differ.
std::optional<uint64_t> checked_num_bytes(const Box& box, size_t itemsize = 1);

// Shape as "[2, 3]" for messages.
std::string shape_to_string(const Shape& s);

// ---- Saving: views of caller-owned bytes -----------------------------------

// One shard handed to save(): `data` points at the box's bytes in C order,
// exactly num_elements(box) * dtype_size bytes.
struct ShardView {
  Box box;
  const void* data = nullptr;
};

// One leaf handed to save(): shards whose boxes cover the shape exactly once
// (a single process), or, in a multi-process save, the disjoint shards this
// process writes (sharded_leaf_view() picks them from a sharding: one
// replica of each box, the lowest device id's); the coordinator checks that
// all processes' shards together cover every leaf exactly once.
struct LeafView {
  std::string prefix;
  std::string path;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::vector<ShardView> shards;

  // A leaf held whole in one host buffer.
  static LeafView full(std::string prefix, std::string path, DType dtype, Shape shape,
                       const void* data);
  uint64_t num_bytes() const;  // of the whole leaf
};

// ---- Restoring: owned host buffers -----------------------------------------

// Heap bytes with a chosen alignment. The data pointer may sit at an offset
// inside a larger aligned allocation (restore places it so that direct I/O can
// land in it without a copy); callers only see data()/size().
class Buffer {
 public:
  Buffer() = default;
  // Allocates `size` bytes whose address is congruent to `phase` modulo
  // `alignment` (a power of two). Contents are uninitialised.
  static Buffer allocate(size_t size, size_t alignment = 64, size_t phase = 0);
  // A view of caller-owned memory (restore into existing arrays). The
  // caller keeps it alive as long as the Buffer is used.
  static Buffer wrap(void* data, size_t size);
  // Bytes [offset, offset + size) of this buffer, sharing its ownership: the
  // memory lives as long as any slice of it (restore hands out small leaves
  // read together as slices of one allocation).
  Buffer slice(size_t offset, size_t size) const;
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<std::byte> base_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One device's part of a leaf restored into a sharding: the box it holds,
// its bytes in C order. Devices holding the same box share one Buffer.
struct DeviceShard {
  int64_t device_id = 0;
  Box box;
  Buffer data;
};

// A restored leaf: the whole global array in C order, or (restore into a
// sharding) one DeviceShard per local device in mesh order and no `data`.
struct Tensor {
  std::string prefix;
  std::string path;
  DType dtype = DType::kFloat32;
  Shape shape;
  Buffer data;
  std::vector<DeviceShard> device_shards;
};

// What a template expects of a leaf (for restore validation).
struct LeafSpec {
  std::string prefix;
  std::string path;
  DType dtype = DType::kFloat32;
  Shape shape;
};

}  // namespace ckptio
