// Backends loaded on demand (src/storage/backend_module.h): the registry
// calls load_backend_module() for a scheme nobody registered, and a module
// that opens it is looked for beside the code that holds the core (the CLI,
// the Python extension, libckptio_core.so), in a `ckptio` folder there, and
// in <that>/../<libdir>/ckptio (an installed CLI), or only in the
// directories of CKPTIO_BACKEND_PATH when that is set.
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "src/storage/backend_module.h"

#ifndef CKPTIO_INSTALL_LIBDIR
#define CKPTIO_INSTALL_LIBDIR "lib"
#endif

namespace ckptio {
namespace {

struct KnownModule {
  const char* scheme;
  const char* file;
};
constexpr KnownModule kKnownModules[] = {{"s3", "ckptio_s3_backend.so"}};

// The file of the loaded object whose segments hold `address` ("" if none).
std::string object_holding(const void* address) {
  struct Search {
    uintptr_t address = 0;
    bool found = false;
    bool main_program = false;
    std::string name;
  } search;
  search.address = reinterpret_cast<uintptr_t>(address);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && s->address >= start && s->address < start + ph.p_memsz) {
            s->found = true;
            s->name = info->dlpi_name ? info->dlpi_name : "";
            s->main_program = s->name.empty();  // the loader names every object but the program
            return 1;
          }
        }
        return 0;
      },
      &search);
  if (!search.found) return "";
  std::string path = search.main_program ? "/proc/self/exe" : search.name;
  char real[PATH_MAX];
  return realpath(path.c_str(), real) ? std::string(real) : path;
}

std::vector<std::string> module_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("CKPTIO_BACKEND_PATH"); env && *env) {
    std::string list = env;
    for (size_t at = 0; at <= list.size();) {
      size_t end = list.find(':', at);
      if (end == std::string::npos) end = list.size();
      if (end > at) dirs.push_back(list.substr(at, end - at));
      at = end + 1;
    }
    return dirs;
  }
  const std::string self = object_holding(reinterpret_cast<const void*>(&module_dirs));
  const size_t slash = self.rfind('/');
  if (slash == std::string::npos) return dirs;
  const std::string dir = self.substr(0, slash);
  dirs = {dir, dir + "/ckptio", dir + "/../" CKPTIO_INSTALL_LIBDIR "/ckptio"};
  return dirs;
}

std::string joined(const std::vector<std::string>& dirs) {
  std::string out;
  for (const auto& d : dirs) out += (out.empty() ? "" : ", ") + d;
  return out.empty() ? std::string("(no directory)") : out;
}

}  // namespace

const char* backend_module_file(const std::string& scheme) {
  for (const auto& m : kKnownModules)
    if (scheme == m.scheme) return m.file;
  return nullptr;
}

std::vector<std::string> backend_module_schemes() {
  std::vector<std::string> out;
  for (const auto& m : kKnownModules) out.push_back(m.scheme);
  std::sort(out.begin(), out.end());
  return out;
}

Result<const BackendModule*> load_backend_module(const std::string& scheme) {
  const char* file = backend_module_file(scheme);
  if (!file) return Status(Code::kNotFound, "no backend module for scheme '" + scheme + "'");
  static std::mutex mu;  // one load at a time; dlopen of a loaded module is cheap
  std::lock_guard lock(mu);
  const std::vector<std::string> dirs = module_dirs();
  std::string path;
  for (const auto& d : dirs) {
    struct stat st{};
    if (::stat((d + "/" + file).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      path = d + "/" + file;
      break;
    }
  }
  const std::string what = scheme + ":// URIs need the backend module " + file;
  if (path.empty())
    return Status(Code::kUnimplemented, what + ", which is not in " + joined(dirs) +
                                            " (the build puts it beside the ckptio CLI and the Python "
                                            "extension; CKPTIO_BACKEND_PATH names other directories)");
  // Never closed: storages it made may live until exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    return Status(Code::kUnimplemented, what + ": " + (err ? err : "dlopen failed on " + path));
  }
  using Entry = const BackendModule* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kBackendModuleEntry));
  const BackendModule* module = entry ? entry() : nullptr;
  if (!module || !module->open || !module->abi)
    return Status(Code::kUnimplemented, what + ": " + path + " has no " + kBackendModuleEntry);
  if (std::string(module->abi) != kBackendModuleAbi)
    return Status(Code::kUnimplemented, what + ": " + path + " was built by another build of ckptio (" +
                                            module->abi + "; this program: " + kBackendModuleAbi + ")");
  return module;
}

}  // namespace ckptio
