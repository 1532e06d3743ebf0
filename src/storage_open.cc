#include <string>

#include "backends/local/local_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/storage.h"

namespace ckptio {

Result<std::shared_ptr<Storage>> open_storage(const std::string& uri, const StorageOptions& options) {
  if (uri.empty()) return invalid_argument("empty URI");
  if (uri.rfind("mem://", 0) == 0) return memory_storage_named(uri.substr(6));
  if (uri.rfind("file://", 0) == 0) {
    std::string path = uri.substr(7);
    if (path.empty() || path[0] != '/')
      return invalid_argument("file URI must be file:///absolute/path, got '" + uri + "'");
    return make_local_storage(path, options);
  }
  size_t scheme = uri.find("://");
  if (scheme != std::string::npos)
    return invalid_argument("unsupported URI scheme '" + uri.substr(0, scheme) + "' in '" + uri +
                            "' (supported: a path, file://, mem://)");
  return make_local_storage(uri, options);
}

}  // namespace ckptio
