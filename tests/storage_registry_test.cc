// The backend registry (include/ckptio/storage.h): the built-in backends are
// registered by linking ckptio, a new scheme can be added, a taken one is
// refused, and an unknown one is an error that lists what is there.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backends/memory/memory_storage.h"
#include "ckptio/local.h"
#include "ckptio/s3.h"
#include "ckptio/storage.h"

namespace ckptio {
namespace {

TEST(StorageRegistry, BuiltInBackendsAreRegisteredByLinking) {
  const std::vector<std::string> schemes = registered_storage_schemes();
  for (const char* want : {"", "file", "mem", "s3"})
    EXPECT_NE(std::find(schemes.begin(), schemes.end(), want), schemes.end()) << "scheme '" << want << "'";
  EXPECT_TRUE(std::is_sorted(schemes.begin(), schemes.end()));
}

TEST(StorageRegistry, ANewSchemeOpensThroughOpenStorageWithItsOptions) {
  struct TestOptions {
    std::string tag = "default";
  };
  std::string seen_uri, seen_tag;
  ASSERT_TRUE(register_storage("regtest", [&](const std::string& uri, const StorageOptions& o) {
                seen_uri = uri;
                seen_tag = o.get_or_default<TestOptions>().tag;
                return Result<std::shared_ptr<Storage>>(make_memory_storage(false));
              }).ok());
  StorageOptions o;
  o.get<TestOptions>().tag = "set";
  o.get<S3Options>().region = "elsewhere";  // another backend's options ride along untouched
  auto s = open_storage("regtest://bucket/x", o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE((*s)->caps().atomic_rename);
  EXPECT_EQ(seen_uri, "regtest://bucket/x");
  EXPECT_EQ(seen_tag, "set");
  // Copies are independent values.
  StorageOptions copy = o;
  copy.get<TestOptions>().tag = "changed";
  EXPECT_EQ(o.get_or_default<TestOptions>().tag, "set");
  EXPECT_EQ(StorageOptions().get_or_default<LocalOptions>().direct_io, "auto");

  // Taken: refused, and the first opener stays.
  Status again = register_storage("regtest", [](const std::string&, const StorageOptions&) {
    return Result<std::shared_ptr<Storage>>(invalid_argument("the second opener"));
  });
  EXPECT_EQ(again.code(), Code::kAlreadyExists) << again.to_string();
  EXPECT_TRUE(open_storage("regtest://y", o).ok());
}

TEST(StorageRegistry, BadAndUnknownSchemesAreClearErrors) {
  auto opener = [](const std::string&, const StorageOptions&) {
    return Result<std::shared_ptr<Storage>>(make_memory_storage(true));
  };
  EXPECT_EQ(register_storage("a://b", opener).code(), Code::kInvalidArgument);
  EXPECT_EQ(register_storage("a/b", opener).code(), Code::kInvalidArgument);
  EXPECT_EQ(register_storage("nothing", nullptr).code(), Code::kInvalidArgument);

  auto unknown = open_storage("gs://bucket/run");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Code::kInvalidArgument);
  const std::string msg = unknown.status().message();
  EXPECT_NE(msg.find("unsupported URI scheme 'gs'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("s3://"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a path"), std::string::npos) << msg;
  EXPECT_EQ(open_storage("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(open_storage("file://relative").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ckptio
