// Where each selected leaf of a restore into a sharding goes: its partition
// spec (an explicit LeafSharding, else the first matching partition rule),
// the boxes of this process's devices, the distinct ones among them (one
// buffer each; devices holding the same box share it), and the dtype it is
// restored in. Shared by the restore of ckptio's own steps
// (restore_sharded.cc) and of zarr steps (restore_zarr.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/manager.h"

namespace ckptio {

struct LeafTargets {
  std::string name;                 // "model/params.w"
  std::string spec;                 // its target PartitionSpec, for messages
  std::vector<Box> targets;         // the distinct boxes of the local devices
  std::vector<uint32_t> target_of;  // per local device (Tensor::device_shards order)
  Tensor tensor;                    // prefix, path, restored dtype, shape, device_shards without buffers
};

class ShardingTargets {
 public:
  // Checks options.sharding (which must be set): its devices, its leaves.
  static Result<ShardingTargets> make(const RestoreOptions& options);
  Result<LeafTargets> leaf(const std::string& prefix, const LeafRecord& rec) const;

 private:
  const RestoreOptions* options_ = nullptr;
  std::vector<size_t> local_;  // mesh positions of this process's devices
  std::map<std::string, const LeafSharding*> given_;
  std::map<std::string, DType> want_;
};

// The dtype a leaf is restored in: the template's (allow_cast), else
// float_dtype for floating leaves, else the saved one. `want`: the
// template's dtypes by "prefix/path".
DType restored_dtype(const RestoreOptions& options, const std::map<std::string, DType>& want,
                     const std::string& name, DType saved);
std::map<std::string, DType> template_dtypes(const RestoreOptions& options);
// A leaf of `shape` restored as `to` fits in 64 bits of bytes. The saved
// bytes do (the index and .zarray readers check), a cast to a wider dtype's
// may not (a hostile index: bfloat16 [2^62 + 1] as float64): the
// destination's size wrapped, and the reads overran it. kInvalidArgument
// naming the leaf otherwise; checked by every restore path before any read.
Status check_restored_bytes(const std::string& name, const Shape& shape, DType to);

}  // namespace ckptio
