// The fixture of the suites that run every test on each backend: the memory
// store as a POSIX-like and as an object-store-like backend, the local
// io_uring backend in a fresh temporary directory, and (for the suites that
// open them) S3-compatible servers. Each test gets the store (base_) and a
// FaultStorage over it (faults_) to inject failures through.
//
// A suite derives from BackendTest, names its temporary directories, and is
// instantiated with one of the value lists below and backend_name:
//
//   class ManagerTest : public testutil::BackendTest {
//    protected:
//     ManagerTest() : BackendTest("ckptio-mgr-") {}
//   };
//   INSTANTIATE_TEST_SUITE_P(Backends, ManagerTest, testutil::local_backends(),
//                            testutil::backend_name);
//
// A suite that overrides SetUp() calls BackendTest::SetUp() first and returns
// if it skipped or failed (the store is then not there).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "backends/fault/fault_storage.h"
#include "backends/local/local_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"

namespace ckptio::testutil {

// The order is part of the tests: --gtest_list_tests prints a parameter as
// its number, and some tests seed from it.
enum class Backend { kMemoryPosix, kMemoryObject, kLocal, kS3Moto, kS3Ceph };

// The parameter's part of a test's name (ctest and CI filter on these).
inline std::string backend_label(Backend b) {
  switch (b) {
    case Backend::kMemoryPosix: return "MemoryPosix";
    case Backend::kMemoryObject: return "MemoryObjectStore";
    case Backend::kLocal: return "Local";
    case Backend::kS3Moto: return "Moto";  // tests/s3/s3_servers.cmake starts moto for it
    case Backend::kS3Ceph: return "Ceph";  // ... and Ceph's radosgw for this one
  }
  return "Unknown";
}

// The name generator of INSTANTIATE_TEST_SUITE_P: MemoryPosix, Local, ...
inline std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return backend_label(info.param);
}

// The backends every machine has: no server, no network.
inline auto local_backends() {
  return ::testing::Values(Backend::kMemoryPosix, Backend::kMemoryObject, Backend::kLocal);
}

// local_backends() and the S3 servers; a suite instantiated with these
// overrides open_remote().
inline auto all_backends() {
  return ::testing::Values(Backend::kMemoryPosix, Backend::kMemoryObject, Backend::kLocal,
                           Backend::kS3Moto, Backend::kS3Ceph);
}

class BackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  // `dir_prefix` names the local backend's temporary directory:
  // <temp>/<dir_prefix><pid>-<n>, e.g. "ckptio-mgr-".
  explicit BackendTest(std::string dir_prefix) : dir_prefix_(std::move(dir_prefix)) {}

  void SetUp() override {
    switch (GetParam()) {
      case Backend::kMemoryPosix: base_ = make_memory_storage(true); break;
      case Backend::kMemoryObject: base_ = make_memory_storage(false); break;
      case Backend::kLocal: {
        dir_ = std::filesystem::temp_directory_path() /
               (dir_prefix_ + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
        std::filesystem::remove_all(dir_);
        auto s = make_local_storage(dir_.string());
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        base_ = *s;
        break;
      }
      case Backend::kS3Moto:
      case Backend::kS3Ceph: {
        auto s = open_remote(GetParam());
        if (s.status().code() == Code::kUnimplemented) GTEST_SKIP() << s.status().to_string();
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        base_ = *s;
        break;
      }
    }
    faults_ = make_fault_storage(base_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Opens a backend behind a server (kS3Moto, kS3Ceph), fresh and empty.
  // kUnimplemented skips the test (no server here); another error fails it.
  virtual Result<std::shared_ptr<Storage>> open_remote(Backend b) {
    return Status(Code::kInvalidArgument,
                  "this suite does not open " + backend_label(b) + ": override open_remote()");
  }

  std::shared_ptr<Storage> base_;
  std::shared_ptr<FaultStorage> faults_;  // over base_
  std::filesystem::path dir_;             // the local backend's root; empty for the others

 private:
  std::string dir_prefix_;
  static inline int counter_ = 0;
};

}  // namespace ckptio::testutil
