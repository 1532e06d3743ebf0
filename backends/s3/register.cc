// Registers the S3 backend for s3://bucket[/prefix] URIs in a program linked
// against ckptio::ckptio (the registry is in include/ckptio/storage.h). The
// CLI and the Python package load it on demand instead (module/s3_module.cc).
#include "backends/s3/s3_storage.h"
#include "ckptio/storage.h"

namespace ckptio {
namespace {

const StorageRegistration registration({"s3"}, s3::open_s3_uri);

}  // namespace
}  // namespace ckptio
