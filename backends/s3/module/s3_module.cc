// The S3 backend as a module (src/storage/backend_module.h): built as
// ckptio_s3_backend.so beside the CLI and the Python extension, which link
// no S3 code and load this on their first s3:// URI. Everything else in the
// module (the backend, and the part of the core it uses, linked from the
// static archives) is hidden: the module is a closed box with one door.
#include "backends/s3/s3_storage.h"
#include "src/storage/backend_module.h"

extern "C" __attribute__((visibility("default"))) const ckptio::BackendModule* ckptio_backend_module_v1() {
  static const ckptio::BackendModule module{ckptio::kBackendModuleAbi, "s3", &ckptio::s3::open_s3_uri};
  return &module;
}
