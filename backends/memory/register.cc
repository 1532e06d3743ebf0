// Registers the in-memory backend for mem://NAME URIs (the registry is in
// include/ckptio/storage.h).
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

#include "backends/memory/memory_storage.h"
#include "ckptio/storage.h"

namespace ckptio {
namespace {

const bool registered = [] {
  Status st = register_storage("mem", [](const std::string& uri, const StorageOptions&) {
    return Result<std::shared_ptr<Storage>>(memory_storage_named(uri.substr(6)));  // after "mem://"
  });
  if (!st.ok()) {
    spdlog::critical("ckptio: {}", st.to_string());
    std::abort();  // two memory backends linked into one program: a build error
  }
  return true;
}();

}  // namespace
}  // namespace ckptio
