// Registers the local-disk backend for plain paths and file:///path URIs
// (the registry is in include/ckptio/storage.h).
#include <string>

#include "backends/local/local_storage.h"
#include "ckptio/local.h"
#include "ckptio/storage.h"

namespace ckptio {
namespace {

Result<std::shared_ptr<Storage>> open_local(const std::string& uri, const StorageOptions& options) {
  std::string path = uri;
  if (uri.rfind("file://", 0) == 0) {
    path = uri.substr(7);
    if (path.empty() || path[0] != '/')
      return invalid_argument("file URI must be file:///absolute/path, got '" + uri + "'");
  }
  return make_local_storage(path, options.get_or_default<LocalOptions>());
}

const StorageRegistration registration({"", "file"}, open_local);

}  // namespace
}  // namespace ckptio
