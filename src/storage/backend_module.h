// A backend built as a module that a program loads on the first URI of its
// scheme (src/storage/registry.cc), so that a program that never opens such a
// URI never loads the backend's libraries: the S3 backend's libcurl, OpenSSL
// and pugixml pull in some thirty shared libraries, ~40 ms of a cold start
// (docs/architecture.md, "Backends loaded on demand").
//
// The module exports one C function, kBackendModuleEntry, returning a
// BackendModule. The module and the program that loads it must come from one
// build: the types passed through `open` (std::string, StorageOptions,
// Result, Storage) are laid out by the same headers and compiler on both
// sides, which `abi` checks (kBackendModuleAbi, set by CMake per build tree).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptio/storage.h"

#ifndef CKPTIO_MODULE_ABI
#define CKPTIO_MODULE_ABI "unset"
#endif

namespace ckptio {

struct BackendModule {
  const char* abi;      // kBackendModuleAbi of the build that made the module
  const char* schemes;  // the schemes it opens, separated by ","
  Result<std::shared_ptr<Storage>> (*open)(const std::string& uri, const StorageOptions& options);
};

inline constexpr const char* kBackendModuleAbi = "ckptio " CKPTIO_MODULE_ABI " " __VERSION__;
inline constexpr const char* kBackendModuleEntry = "ckptio_backend_module_v1";

// The file of the module that opens `scheme` ("ckptio_s3_backend.so" for
// "s3"), or nullptr.
const char* backend_module_file(const std::string& scheme);

// The schemes that have a module, sorted.
std::vector<std::string> backend_module_schemes();

// Finds, loads and checks the module of `scheme` (backend_modules.cc); the
// caller registers its opener. kUnimplemented, naming the directories
// searched, when it is not there or not of this build.
Result<const BackendModule*> load_backend_module(const std::string& scheme);

}  // namespace ckptio
