// The backend registry (include/ckptio/storage.h): schemes to openers. The
// core opens every URI here and names no backend; backends register as the
// library loads (backends/*/register.cc).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "ckptio/storage.h"
#include "src/storage/backend_module.h"

namespace ckptio {

namespace {

struct Registry {
  std::mutex mu;  // guards openers
  std::map<std::string, StorageOpener> openers;
};

// Constructed on first use, so that a backend's registration during static
// initialization of another library finds it whatever the load order.
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: openers may run at exit
  return *r;
}

std::string scheme_list(const std::map<std::string, StorageOpener>& openers) {
  std::string out;
  for (const auto& [scheme, opener] : openers) {
    if (!out.empty()) out += ", ";
    out += scheme.empty() ? std::string("a path") : scheme + "://";
  }
  for (const std::string& scheme : backend_module_schemes())  // modules (backend_module.h)
    if (!openers.count(scheme)) out += (out.empty() ? "" : ", ") + scheme + ":// (loaded on demand)";
  return out.empty() ? "none: link ckptio::ckptio, which registers the built-in backends" : out;
}

}  // namespace

Status register_storage(const std::string& scheme, StorageOpener opener) {
  if (scheme.find("://") != std::string::npos || scheme.find('/') != std::string::npos)
    return invalid_argument("storage scheme '" + scheme + "' must be a bare name such as 's3'");
  if (!opener) return invalid_argument("storage scheme '" + scheme + "': no opener");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.openers.emplace(scheme, std::move(opener)).second)
    return Status(Code::kAlreadyExists, "storage scheme '" + scheme + "' is registered already");
  return Status::OK();
}

StorageRegistration::StorageRegistration(std::initializer_list<const char*> schemes, StorageOpener opener) {
  for (const char* scheme : schemes) {
    Status st = register_storage(scheme, opener);
    if (!st.ok()) {
      std::fprintf(stderr, "ckptio: %s\n", st.to_string().c_str());
      std::abort();
    }
  }
}

std::vector<std::string> registered_storage_schemes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [scheme, opener] : r.openers) out.push_back(scheme);
  return out;
}

namespace {

// Registers the opener of a backend built as a module (backend_module.h) on
// the first URI of its scheme. A module linked against a shared
// libckptio_s3.so registered it as it loaded; one linked from the static
// archives hands its opener over.
Status load_module_of(const std::string& scheme) {
  CKPTIO_ASSIGN_OR_RETURN(const BackendModule* module, load_backend_module(scheme));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.openers.count(scheme)) r.openers.emplace(scheme, module->open);
  return Status::OK();
}

}  // namespace

Result<std::shared_ptr<Storage>> open_storage(const std::string& uri, const StorageOptions& options) {
  if (uri.empty()) return invalid_argument("empty URI");
  const size_t sep = uri.find("://");
  const std::string scheme = sep == std::string::npos ? std::string() : uri.substr(0, sep);
  bool registered;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    registered = r.openers.count(scheme) > 0;
  }
  if (!registered && backend_module_file(scheme)) CKPTIO_RETURN_IF_ERROR(load_module_of(scheme));
  StorageOpener opener;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.openers.find(scheme);
    if (it == r.openers.end()) {
      if (scheme.empty()) return invalid_argument("no backend for plain paths such as '" + uri +
                                                  "' (registered: " + scheme_list(r.openers) + ")");
      return invalid_argument("unsupported URI scheme '" + scheme + "' in '" + uri +
                              "' (supported: " + scheme_list(r.openers) + ")");
    }
    opener = it->second;  // called outside the lock: opening may take long (S3 credentials)
  }
  return opener(uri, options);
}

}  // namespace ckptio
