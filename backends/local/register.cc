// Registers the local-disk backend for plain paths and file:///path URIs
// (the registry is in include/ckptio/storage.h).
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

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

const bool registered = [] {
  for (const char* scheme : {"", "file"}) {
    Status st = register_storage(scheme, open_local);
    if (!st.ok()) {
      spdlog::critical("ckptio: {}", st.to_string());
      std::abort();  // two local backends linked into one program: a build error
    }
  }
  return true;
}();

}  // namespace
}  // namespace ckptio
