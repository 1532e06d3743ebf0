// Registers the in-memory backend for mem://NAME URIs (the registry is in
// include/ckptio/storage.h).
#include <string>

#include "backends/memory/memory_storage.h"
#include "ckptio/storage.h"

namespace ckptio {
namespace {

Result<std::shared_ptr<Storage>> open_memory(const std::string& uri, const StorageOptions&) {
  return memory_storage_named(uri.substr(6));  // after "mem://"
}

const StorageRegistration registration({"mem"}, open_memory);

}  // namespace
}  // namespace ckptio
