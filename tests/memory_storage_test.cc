// What the memory backend adds beyond the conformance suite: strict checks of
// the write contract (it is the reference the core is tested against), the
// synchronous callbacks, the named registry behind mem://NAME.
#include <gtest/gtest.h>

#include "backends/memory/memory_storage.h"
#include "testutil/conformance.h"

namespace ckptio {
namespace {

using testutil::as_bytes;
using testutil::pattern_bytes;

// Writes `n` bytes of `fill` at `offset`; returns what the callback saw.
Status write_at(WritableObject& w, uint64_t offset, size_t n, char fill = 'x') {
  std::string bytes(n, fill);
  Status seen(Code::kInternal, "callback did not run");
  w.write_async(offset, as_bytes(bytes), [&](Status st) { seen = st; });
  return seen;  // memory calls back before write_async returns
}

TEST(MemoryStorage, CapsAndDescribe) {
  auto posix = make_memory_storage(true);
  EXPECT_TRUE(posix->caps().atomic_rename);
  EXPECT_TRUE(posix->caps().atomic_exchange);
  auto object = make_memory_storage(false);
  EXPECT_FALSE(object->caps().atomic_rename);
  EXPECT_FALSE(object->caps().atomic_exchange);
  EXPECT_EQ(posix->describe().rfind("mem://", 0), 0u) << posix->describe();
  EXPECT_NE(posix->describe(), object->describe()) << "anonymous stores are told apart in messages";
  auto w = posix->create("k", 1);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->granularity(), 1u);
  EXPECT_EQ((*w)->alignment(), 1u);
  EXPECT_EQ(posix->read_alignment(), 1u);
}

TEST(MemoryStorage, NamedStoresAreSharedByName) {
  auto a1 = memory_storage_named("memtest-a");
  auto a2 = memory_storage_named("memtest-a");
  auto b = memory_storage_named("memtest-b");
  EXPECT_EQ(a1.get(), a2.get());
  EXPECT_NE(a1.get(), b.get());
  EXPECT_EQ(a1->describe(), "mem://memtest-a");
  EXPECT_TRUE(a1->caps().atomic_rename);
  ASSERT_TRUE(a1->put("k", as_bytes("v")).ok());
  EXPECT_EQ(a2->get("k", 10).value(), "v");
  EXPECT_EQ(b->stat("k").status().code(), Code::kNotFound);
  // The store outlives every handle to it, like a file system.
  a1.reset();
  a2.reset();
  EXPECT_EQ(memory_storage_named("memtest-a")->get("k", 10).value(), "v");
}

TEST(MemoryStorage, CallbackRunsBeforeWriteAsyncReturns) {
  auto s = make_memory_storage();
  auto w = s->create("k", 3);
  ASSERT_TRUE(w.ok());
  bool called = false;
  std::string bytes = "abc";
  (*w)->write_async(0, as_bytes(bytes), [&](Status st) {
    EXPECT_TRUE(st.ok());
    called = true;
  });
  EXPECT_TRUE(called);
  bytes = "zzz";  // the writer copied the bytes
  ASSERT_TRUE((*w)->finish(3).ok());
  EXPECT_EQ(s->get("k", 3).value(), "abc");
}

TEST(MemoryStorage, FinishWithHolesIsInternalError) {
  auto s = make_memory_storage();
  {
    auto w = s->create("hole-in-middle", 300);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(write_at(**w, 0, 100).ok());
    ASSERT_TRUE(write_at(**w, 200, 100).ok());
    Status st = (*w)->finish(300);
    EXPECT_EQ(st.code(), Code::kInternal) << st.to_string();
    EXPECT_NE(st.message().find("[100, 200)"), std::string::npos) << st.to_string();
  }
  {
    auto w = s->create("hole-at-start", 300);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(write_at(**w, 100, 200).ok());
    EXPECT_EQ((*w)->finish(300).code(), Code::kInternal);
  }
  {
    auto w = s->create("short", 300);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(write_at(**w, 0, 200).ok());
    EXPECT_EQ((*w)->finish(300).code(), Code::kInternal);
  }
  {
    auto w = s->create("nothing-written", 1);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->finish(1).code(), Code::kInternal);
  }
  {
    // alignment() is 1, so no padding is allowed past final_size.
    auto w = s->create("past-the-end", 300);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(write_at(**w, 0, 301).ok());
    Status st = (*w)->finish(300);
    EXPECT_EQ(st.code(), Code::kInternal) << st.to_string();
  }
  auto listed = s->list("", false);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->objects.empty()) << "a failed finish() publishes nothing";
}

TEST(MemoryStorage, OverlappingWritesAreInvalidArgument) {
  auto s = make_memory_storage();
  auto w = s->create("k", 300);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(write_at(**w, 100, 100).ok());
  EXPECT_EQ(write_at(**w, 150, 100).code(), Code::kInvalidArgument);  // tail overlaps
  EXPECT_EQ(write_at(**w, 50, 51).code(), Code::kInvalidArgument);    // head overlaps
  EXPECT_EQ(write_at(**w, 100, 100).code(), Code::kInvalidArgument);  // the same range
  EXPECT_EQ(write_at(**w, 120, 10).code(), Code::kInvalidArgument);   // inside
  EXPECT_EQ(write_at(**w, 0, 300).code(), Code::kInvalidArgument);    // around
  ASSERT_TRUE(write_at(**w, 0, 100).ok());    // adjacent is fine
  ASSERT_TRUE(write_at(**w, 200, 100).ok());
  Status st = (*w)->finish(300);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << "finish() reports the earlier write error";
  EXPECT_EQ(s->stat("k").status().code(), Code::kNotFound);
}

TEST(MemoryStorage, ZeroLengthWritesAreHarmless) {
  auto s = make_memory_storage();
  auto w = s->create("k", 10);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(write_at(**w, 0, 10).ok());
  EXPECT_TRUE(write_at(**w, 5, 0).ok());
  ASSERT_TRUE((*w)->finish(10).ok());
  EXPECT_EQ(s->get("k", 10).value(), std::string(10, 'x'));
}

TEST(MemoryStorage, WriterIsSpentAfterFinishOrAbort) {
  auto s = make_memory_storage();
  auto w = s->create("k", 4);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(write_at(**w, 0, 4, 'a').ok());
  ASSERT_TRUE((*w)->finish(4).ok());
  EXPECT_EQ(write_at(**w, 4, 4).code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w)->finish(4).code(), Code::kFailedPrecondition);
  (*w)->abort();  // after finish: a no-op, the object stays
  EXPECT_EQ(s->get("k", 4).value(), "aaaa");

  auto w2 = s->create("k2", 4);
  ASSERT_TRUE(w2.ok());
  (*w2)->abort();
  EXPECT_EQ(write_at(**w2, 0, 4).code(), Code::kFailedPrecondition);
  EXPECT_EQ((*w2)->finish(0).code(), Code::kFailedPrecondition);
  EXPECT_EQ(s->stat("k2").status().code(), Code::kNotFound);
}

TEST(MemoryStorage, WriterOutlivesItsStorageHandle) {
  auto s = make_memory_storage();
  auto w = s->create("k", 4);
  ASSERT_TRUE(w.ok());
  std::weak_ptr<Storage> weak = s;
  s.reset();
  ASSERT_TRUE(write_at(**w, 0, 4).ok());
  EXPECT_TRUE((*w)->finish(4).ok());
  EXPECT_FALSE(weak.expired()) << "the writer keeps its store alive";
  w->reset();
  EXPECT_TRUE(weak.expired());
}

TEST(MemoryStorage, KeyRulesMatchTheLocalBackend) {
  auto s = make_memory_storage();
  for (const std::string k : {"a//b", "./a", "a/./b", "a/", "/"}) {
    EXPECT_EQ(s->put(k, as_bytes("v")).code(), Code::kInvalidArgument) << k;
    EXPECT_EQ(s->create(k, 1).status().code(), Code::kInvalidArgument) << k;
  }
  EXPECT_EQ(s->list("a//", false).status().code(), Code::kInvalidArgument);
  // A prefix may end mid-name, even in a dot.
  EXPECT_TRUE(s->list("a/.", false).ok());
  EXPECT_TRUE(s->list("run-", true).ok());
  EXPECT_TRUE(s->put(".hidden/x", as_bytes("v")).ok());
}

TEST(MemoryStorage, RenameArgumentsAreChecked) {
  auto s = make_memory_storage();
  ASSERT_TRUE(s->put("a/x", as_bytes("v")).ok());
  EXPECT_EQ(s->rename("a/", "a/b/", RenameMode::kNoReplace).code(), Code::kInvalidArgument);
  EXPECT_EQ(s->rename("a/", "a/", RenameMode::kExchange).code(), Code::kInvalidArgument);
  EXPECT_EQ(s->rename("a", "b/", RenameMode::kNoReplace).code(), Code::kInvalidArgument);
  EXPECT_EQ(s->rename("a/", "b", RenameMode::kNoReplace).code(), Code::kInvalidArgument);
  EXPECT_EQ(s->rename("", "b/", RenameMode::kNoReplace).code(), Code::kInvalidArgument);
  EXPECT_EQ(s->get("a/x", 1).value(), "v");
  // "a/" is not a prefix of "ab/": renaming between them is fine.
  EXPECT_TRUE(s->rename("a/", "ab/", RenameMode::kNoReplace).ok());
  EXPECT_EQ(s->get("ab/x", 1).value(), "v");
}

TEST(MemoryStorage, ObjectStoreHasNoRename) {
  auto s = make_memory_storage(false);
  ASSERT_TRUE(s->put("a/x", as_bytes("v")).ok());
  Status st = s->rename("a/", "b/", RenameMode::kNoReplace);
  EXPECT_EQ(st.code(), Code::kUnimplemented);
  EXPECT_NE(st.message().find("mem://"), std::string::npos) << st.to_string();
  EXPECT_TRUE(s->sync("a/").ok());
}

TEST(MemoryStorage, ReadIntoNullIsRejected) {
  auto s = make_memory_storage();
  ASSERT_TRUE(s->put("k", as_bytes("abc")).ok());
  ReadRequest r{"k", 0, 3, nullptr};
  EXPECT_EQ(s->read({&r, 1}).code(), Code::kInvalidArgument);
  ReadRequest empty{"k", 3, 0, nullptr};
  EXPECT_TRUE(s->read({&empty, 1}).ok());
  ReadRequest overflow{"k", ~uint64_t{0}, 2, nullptr};
  std::byte b[2];
  overflow.dst = b;
  EXPECT_EQ(s->read({&overflow, 1}).code(), Code::kDataLoss);
}

}  // namespace
}  // namespace ckptio
