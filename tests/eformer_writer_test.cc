// EformerStepWriter (src/save/eformer_writer.h): steps in eformer's
// layout written through write_box() with boxes that are the shards of a
// regular grid, on every backend (memory POSIX-like and object-store-like,
// local disk, moto, Ceph). Read back by ckptio's reader (load_eformer_step,
// CheckpointManager restore and verify) and, on the local backend, by
// zarr-python (Debian's python3-zarr, run with /usr/bin/python3; bfloat16
// read as uint16 through a store that rewrites the dtype). Also: a step is
// invisible until commit(); abort, a failed write and a missing chunk leave
// nothing behind; overwrite. Without zarr-python the zarr-python test skips
// loudly (fails under CI=true).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckptio/ckptio.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/save/eformer_writer.h"
#include "src/util/box_runs.h"
#include "testutil/backend_fixture.h"
#include "testutil/random_bytes.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;
using testutil::Backend;
using zarr::EformerStepWriter;
using zarr::EformerWriteOptions;

// One leaf: where, what, its chunk shape, and the shard shape of the boxes
// handed to write_box (a multiple of the chunks).
struct Leaf {
  std::string prefix, path;
  DType dtype;
  Shape shape, chunks, shard;
};

const std::vector<Leaf>& leaves() {
  static const std::vector<Leaf> v = {
      {"model", "layers.0.kernel", DType::kBFloat16, {64, 48}, {16, 48}, {32, 48}},
      {"model", "embed", DType::kFloat32, {50, 30}, {16, 16}, {32, 16}},  // uneven edges
      {"model", "layers.0.bias", DType::kFloat32, {45}, {16}, {16}},      // 1-D, uneven
      {"tx", "count", DType::kInt32, {}, {}, {}},                         // scalar
      {"tx", "mu.kernel", DType::kFloat32, {5, 7, 9}, {2, 4, 9}, {2, 8, 9}},  // 3-D, uneven
      {"", "rng", DType::kUInt32, {4}, {4}, {4}},                         // top-level "arrays"
  };
  return v;
}

std::string name_of(const Leaf& l) { return l.prefix.empty() ? l.path : l.prefix + "/" + l.path; }

uint64_t num_bytes(const Leaf& l) {
  uint64_t n = dtype_size(l.dtype);
  for (int64_t d : l.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The boxes of the regular grid of `l.shard`, clipped to the shape.
std::vector<Box> shard_boxes(const Leaf& l) {
  std::vector<Box> out;
  const size_t rank = l.shape.size();
  std::vector<int64_t> idx(rank, 0);
  for (;;) {
    Box b;
    for (size_t d = 0; d < rank; ++d) {
      b.start.push_back(idx[d] * l.shard[d]);
      b.stop.push_back(std::min(l.shape[d], (idx[d] + 1) * l.shard[d]));
    }
    out.push_back(b);
    size_t d = rank;
    while (d > 0) {
      --d;
      if (++idx[d] * l.shard[d] < l.shape[d]) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (rank == 0) return out;
  }
}

// The C-order bytes of `box` cut out of the whole leaf.
std::vector<std::byte> cut(const Leaf& l, const std::vector<std::byte>& whole, const Box& box) {
  const size_t item = dtype_size(l.dtype);
  if (l.shape.empty()) return whole;
  uint64_t n = item;
  for (size_t d = 0; d < box.start.size(); ++d) n *= static_cast<uint64_t>(box.stop[d] - box.start[d]);
  std::vector<std::byte> out(n);
  auto layout = run_layout(Box::whole(l.shape), 0, box, box, item);
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  for_each_run(*layout, [&](uint64_t s, uint64_t t, uint64_t k) { std::memcpy(out.data() + t, whole.data() + s, k); });
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using Data = std::map<std::string, std::vector<std::byte>>;  // leaf name -> whole bytes

Data make_data(uint64_t seed) {
  Data d;
  for (const Leaf& l : leaves()) d[name_of(l)] = testutil::random_bytes(num_bytes(l), seed++);
  return d;
}

class EformerWriterTest : public testutil::S3BackendTest {
 protected:
  EformerWriterTest() : S3BackendTest("ckptio-ewriter-") {}

  // Declares every leaf; returns their ids in leaves() order.
  static std::vector<size_t> declare(EformerStepWriter& w) {
    std::vector<size_t> ids;
    for (const Leaf& l : leaves()) {
      auto id = w.add_array(l.prefix, l.path, l.dtype, l.shape, l.chunks);
      EXPECT_TRUE(id.ok()) << name_of(l) << ": " << id.status().to_string();
      ids.push_back(id.ok() ? *id : 0);
    }
    return ids;
  }
  // Writes every shard of every leaf, except `skip` ("leaf name#box number").
  static Status write_all(EformerStepWriter& w, const std::vector<size_t>& ids, const Data& data,
                          const std::string& skip = "") {
    for (size_t i = 0; i < leaves().size(); ++i) {
      const Leaf& l = leaves()[i];
      const std::vector<Box> boxes = shard_boxes(l);
      for (size_t b = 0; b < boxes.size(); ++b) {
        if (name_of(l) + "#" + std::to_string(b) == skip) continue;
        const std::vector<std::byte> bytes = cut(l, data.at(name_of(l)), boxes[b]);
        CKPTIO_RETURN_IF_ERROR(w.write_box(ids[i], boxes[b], bytes));
      }
    }
    return Status::OK();
  }
  // A whole step: start, declare, write, commit.
  Status write_step(Storage& s, int64_t step, const Data& data, EformerWriteOptions o = {}) {
    auto w = EformerStepWriter::start(s, "run-" + std::to_string(step), step, o);
    if (!w.ok()) return w.status();
    auto ids = declare(**w);
    CKPTIO_RETURN_IF_ERROR(write_all(**w, ids, data));
    return (*w)->commit();
  }
  // Restores `step` through the manager and compares every leaf bit for bit.
  void expect_restores(int64_t step, const Data& data) {
    auto loaded = zarr::load_eformer_step(*base_, "run-" + std::to_string(step), step);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    ASSERT_TRUE(loaded->has_value()) << "no eformer step at run-" << step;
    EXPECT_EQ((*loaded)->layout, "eformer");
    CheckpointManager m(base_, {});
    auto r = m.restore(step);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), leaves().size());
    std::map<std::string, const Tensor*> got;
    for (const Tensor& t : r->leaves) got[t.prefix.empty() ? t.path : t.prefix + "/" + t.path] = &t;
    for (const Leaf& l : leaves()) {
      ASSERT_TRUE(got.count(name_of(l))) << name_of(l);
      const Tensor& t = *got[name_of(l)];
      EXPECT_EQ(t.dtype, l.dtype) << name_of(l);
      EXPECT_EQ(t.shape, l.shape) << name_of(l);
      const auto& want = data.at(name_of(l));
      ASSERT_EQ(t.data.size(), want.size()) << name_of(l);
      EXPECT_EQ(std::memcmp(t.data.data(), want.data(), want.size()), 0) << name_of(l) << " differs";
    }
    Status v = m.verify(step);
    EXPECT_TRUE(v.ok()) << v.to_string();
  }
  std::vector<int64_t> steps() {
    CheckpointManager m(base_, {});
    auto s = m.all_steps();
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : std::vector<int64_t>{};
  }
  // Every key and directory the store holds (recursive listing, plus local
  // directories, which list() shows even when empty).
  std::vector<std::string> everything() {
    std::vector<std::string> out;
    auto l = base_->list("", false);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    if (l.ok())
      for (const auto& o : l->objects) out.push_back(o.key);
    auto top = base_->list("", true);
    if (top.ok())
      for (const auto& p : top->prefixes) out.push_back(p);
    auto unfinished = base_->list_unfinished("");
    if (unfinished.ok())
      for (const auto& u : *unfinished) out.push_back("unfinished:" + u.key);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
};

TEST_P(EformerWriterTest, RoundTripsBitExactWithBothSeparators) {
  // '.' with defaults (zstd 1), boxes handed over from three threads at once;
  // '/' uncompressed with a budget of one chunk (write_box blocks).
  const Data a = make_data(1), b = make_data(100);
  {
    auto w = EformerStepWriter::start(*base_, "run-10", 10);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto ids = declare(**w);
    std::vector<std::thread> feeders;
    std::vector<Status> results(3);
    for (size_t t = 0; t < 3; ++t)
      feeders.emplace_back([&, t] {
        for (size_t i = t; i < leaves().size(); i += 3) {
          const Leaf& l = leaves()[i];
          for (const Box& box : shard_boxes(l)) {
            Status s = (*w)->write_box(ids[i], box, cut(l, a.at(name_of(l)), box));
            if (!s.ok() && results[t].ok()) results[t] = s;
          }
        }
      });
    for (auto& f : feeders) f.join();
    for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.to_string();
    Status c = (*w)->commit();
    ASSERT_TRUE(c.ok()) << c.to_string();
  }
  EformerWriteOptions o;
  o.separator = '/';
  o.compressor = zarr::Compressor{zarr::CodecId::kNone};
  o.max_pending_bytes = 1;
  o.threads = 2;
  o.io_threads = 2;
  o.is_temporary = true;
  o.extra_metadata_json = R"({"easydel": {"version": "0.1"}, "note": "caf\u00e9"})";
  Status s = write_step(*base_, 20, b, o);
  ASSERT_TRUE(s.ok()) << s.to_string();

  EXPECT_EQ(steps(), (std::vector<int64_t>{10, 20}));
  expect_restores(10, a);
  expect_restores(20, b);
  // '/' makes chunk directories: embed's chunk (1, 1) is run-20/model/embed/1/1.
  EXPECT_TRUE(base_->stat("run-20/model/embed/1/1").ok());
  EXPECT_TRUE(base_->stat("run-10/model/embed/1.1").ok());
  auto meta = base_->get("run-20/metadata.json", 1 << 20);
  ASSERT_TRUE(meta.ok());
  EXPECT_NE(meta->find(R"("step": 20, "timestamp": ")"), std::string::npos) << *meta;
  EXPECT_NE(meta->find(R"("is_temporary": true, "easydel": {"version":"0.1"}, "note": "caf\u00e9"})"),
            std::string::npos)
      << *meta;
  auto index = base_->get("run-10/tensorstore_index.json", 1 << 20);
  ASSERT_TRUE(index.ok());
  EXPECT_LT(index->find("\"model\""), index->find("\"tx\"")) << *index;  // prefixes in declaration order
  EXPECT_NE(index->find("\"arrays\""), std::string::npos) << *index;
  // Nothing but the two steps (no temporaries left on POSIX).
  for (const std::string& k : everything())
    EXPECT_TRUE(k.starts_with("run-10/") || k.starts_with("run-20/")) << k;
}

// argv[1]: a step directory; argv[2]: the expected bytes, <array dir with '.' for '/'>.raw.
constexpr const char* kReadStep = R"PY(
import json, os, sys
import numpy as np
import zarr
from zarr.storage import DirectoryStore

step, expected = sys.argv[1], sys.argv[2]

class Bf16AsU16(DirectoryStore):
    """Reads bfloat16 arrays (a dtype numpy lacks) as uint16."""
    def __getitem__(self, key):
        value = super().__getitem__(key)
        if key.endswith(".zarray"):
            meta = json.loads(value)
            if meta["dtype"] == "bfloat16":
                meta["dtype"] = "<u2"
            value = json.dumps(meta).encode()
        return value

index = json.load(open(os.path.join(step, "tensorstore_index.json")))
assert index["format"] == "tensorstore", index
entries = [a for arrays in index["prefixes"].values() for a in arrays] + index.get("arrays", [])
meta = json.load(open(os.path.join(step, "metadata.json")))
assert isinstance(meta["step"], int) and isinstance(meta["is_temporary"], bool), meta
import datetime
datetime.datetime.fromisoformat(meta["timestamp"])
for e in entries:
    path = os.path.join(step, e["path"])
    zmeta = json.load(open(os.path.join(path, ".zarray")))
    z = zarr.open_array(store=Bf16AsU16(path, dimension_separator=zmeta["dimension_separator"]), mode="r")
    data = np.asarray(z[...])  # tobytes() is C order; ascontiguousarray would make a scalar 1-D
    assert list(data.shape) == e["shape"], (e, zmeta, data.shape)
    want = open(os.path.join(expected, e["path"].replace("/", ".") + ".raw"), "rb").read()
    if data.tobytes() != want:
        print("MISMATCH", e["path"])
        sys.exit(1)
print("OK", len(entries))
)PY";

// zarr-python reads the local backend's files only.
class EformerWriterZarrPythonTest : public EformerWriterTest {};

TEST_P(EformerWriterZarrPythonTest, ZarrPythonReadsWhatTheWriterWrote) {
  if (std::system("/usr/bin/python3 -c 'import zarr, numcodecs' >/dev/null 2>&1") != 0) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true") FAIL() << "zarr-python is missing under CI: tools/setup-deps installs python3-zarr";
    GTEST_SKIP() << "zarr-python is missing: install python3-zarr and python3-numcodecs (tools/setup-deps does)";
  }
  const Data a = make_data(7);
  ASSERT_TRUE(write_step(*base_, 10, a).ok());
  EformerWriteOptions o;
  o.separator = '/';
  ASSERT_TRUE(write_step(*base_, 20, a, o).ok());
  const fs::path work = dir_.string() + "-py";
  fs::remove_all(work);
  fs::create_directories(work / "expected");
  { std::ofstream(work / "read.py") << kReadStep; }
  for (const Leaf& l : leaves()) {
    std::string dir = l.prefix.empty() ? l.path : l.prefix + "." + l.path;
    std::ofstream out(work / "expected" / (dir + ".raw"), std::ios::binary);
    const auto& bytes = a.at(name_of(l));
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  for (const char* step : {"run-10", "run-20"}) {
    const std::string cmd = "/usr/bin/python3 '" + (work / "read.py").string() + "' '" + (dir_ / step).string() +
                            "' '" + (work / "expected").string() + "' >'" + (work / "log").string() + "' 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << step << ": " << read_file(work / "log");
    EXPECT_NE(read_file(work / "log").find("OK 6"), std::string::npos) << read_file(work / "log");
  }
  fs::remove_all(work);
}

TEST_P(EformerWriterTest, BorrowedBoxesAreReadOnlyUntilWaitBorrowedReturns) {
  // Every leaf handed over whole and borrowed: row bands of it are
  // compressed straight from the caller's memory, other chunks (edges,
  // column splits, the scalar) copied. A budget of two chunks keeps most
  // chunks queued while write_box_borrowed() returns, so the buffers are
  // scribbled over the moment wait_borrowed() returns: a chunk read after it
  // would restore the scribble. zstd, then none (every chunk copied).
  for (const auto& [step, codec] : {std::pair<int64_t, zarr::CodecId>{30, zarr::CodecId::kZstd},
                                    std::pair<int64_t, zarr::CodecId>{40, zarr::CodecId::kNone}}) {
    const Data data = make_data(static_cast<uint64_t>(step));
    Data lent = data;  // the caller's buffers
    EformerWriteOptions o;
    o.compressor = zarr::Compressor{codec};
    o.max_pending_bytes = 2 * 16 * 48 * 2;
    o.threads = 2;
    auto w = EformerStepWriter::start(*base_, "run-" + std::to_string(step), step, o);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto ids = declare(**w);
    for (size_t i = 0; i < leaves().size(); ++i) {
      std::vector<std::byte>& bytes = lent.at(name_of(leaves()[i]));
      Status s = (*w)->write_box_borrowed(ids[i], Box::whole(leaves()[i].shape), bytes);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    (*w)->wait_borrowed();
    for (auto& [name, bytes] : lent) std::fill(bytes.begin(), bytes.end(), std::byte{0xAB});
    Status c = (*w)->commit();
    ASSERT_TRUE(c.ok()) << c.to_string();
    expect_restores(step, data);
  }
}

// abort() drops the chunks still queued, borrowed ones too: wait_borrowed()
// then returns (the caller may reuse its memory). Before, the dropped
// borrowed chunks stayed counted and wait_borrowed() waited for good.
TEST_P(EformerWriterTest, AbortEndsTheWaitForBorrowedChunks) {
  EformerWriteOptions o;
  o.threads = 1;
  auto w = EformerStepWriter::start(*base_, "run-10", 10, o);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const Shape shape{512, 1024};  // 512 chunks of one row (4 KiB), each borrowed
  const std::vector<std::byte> data = testutil::random_bytes(512 * 1024 * 4, 5);
  auto id = (*w)->add_array("model", "rows", DType::kFloat32, shape, {1, 1024});
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  ASSERT_TRUE((*w)->write_box_borrowed(*id, Box::whole(shape), data).ok());
  (*w)->abort();
  std::promise<void> waited;
  std::thread([&w, &waited] {
    (*w)->wait_borrowed();
    waited.set_value();
  }).detach();
  if (waited.get_future().wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "wait_borrowed() still waits 60 s after abort()\n");
    std::_Exit(1);  // (the waiting thread holds the writer)
  }
  EXPECT_TRUE(steps().empty());
}

TEST_P(EformerWriterTest, InvisibleUntilCommitAndAbortLeavesNothing) {
  const Data a = make_data(3);
  {
    auto w = EformerStepWriter::start(*base_, "run-10", 10);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto ids = declare(**w);
    ASSERT_TRUE(write_all(**w, ids, a).ok());
    EXPECT_TRUE(steps().empty());
    ASSERT_TRUE((*w)->commit().ok());
    EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
  }
  const std::vector<std::string> committed = everything();
  {  // abort() after writing everything but commit
    auto w = EformerStepWriter::start(*base_, "run-11", 11);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto ids = declare(**w);
    ASSERT_TRUE(write_all(**w, ids, a).ok());
    EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
    (*w)->abort();
    EXPECT_EQ(everything(), committed);
  }
  {  // the destructor aborts too
    auto w = EformerStepWriter::start(*base_, "run-12", 12);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto ids = declare(**w);
    ASSERT_TRUE(write_all(**w, ids, a, "model/embed#1").ok());
  }
  EXPECT_EQ(everything(), committed);
  EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
  expect_restores(10, a);
}

TEST_P(EformerWriterTest, AFailedWriteFailsCommitAndLeavesNoStep) {
  const Data a = make_data(5);
  struct Case {
    FaultOp op;
    std::string key;  // a substring of the key that fails
  };
  const std::vector<Case> cases = {
      {FaultOp::kCreate, "model/embed/1.1"},  // one chunk
      {FaultOp::kPut, "tensorstore_index.json"},
      {FaultOp::kPut, "layers/0/bias/.zarray"},
      {FaultOp::kPut, "metadata.json"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    faults_->clear_rules();
    FaultRule rule;
    rule.op = c.op;
    rule.key_substr = c.key;
    rule.message = "injected fault";
    faults_->add_rule(rule);
    Status s = write_step(*faults_, 10, a);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), Code::kIOError) << s.to_string();
    EXPECT_NE(s.message().find(rule.key_substr), std::string::npos) << s.to_string();
    EXPECT_TRUE(steps().empty());
    EXPECT_EQ(everything(), std::vector<std::string>{});  // no final directory, no temporary
  }
  faults_->clear_rules();
  ASSERT_TRUE(write_step(*faults_, 10, a).ok());
  expect_restores(10, a);
}

// Two writers of one step that both found it free: the one that aborts (or
// fails) after the other committed leaves the committed step whole. On an
// object store both write under the step's own prefix, and the loser's
// discard removed everything under it, the winner's metadata.json and
// chunks included.
TEST_P(EformerWriterTest, AWriterThatAbortsAfterAnotherCommittedLeavesItsStepWhole) {
  const Data a = make_data(7);
  auto loser = EformerStepWriter::start(*base_, "run-10", 10);
  ASSERT_TRUE(loser.ok()) << loser.status().to_string();
  auto winner = EformerStepWriter::start(*base_, "run-10", 10);
  ASSERT_TRUE(winner.ok()) << winner.status().to_string();
  auto lost = declare(**loser);
  ASSERT_TRUE(write_all(**loser, lost, a).ok());
  auto won = declare(**winner);
  ASSERT_TRUE(write_all(**winner, won, a).ok());
  ASSERT_TRUE((*winner)->commit().ok());
  (*loser)->abort();
  EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
  expect_restores(10, a);
}

// metadata.json stored, its answer lost and the last retry refused (403
// after a key rotation): the step is committed, and the writer says so. On
// an object store only kUnavailable, kIOError, kInternal and kCancelled were
// read back: this one was discarded after it had been visible.
TEST_P(EformerWriterTest, AMetadataPutThatTookEffectBehindAnyErrorIsACommit) {
  const Data a = make_data(9);
  FaultRule rule;
  rule.op = FaultOp::kPut;
  rule.key_substr = "metadata.json";
  rule.code = Code::kPermissionDenied;
  rule.after = true;
  rule.times = 1;
  faults_->add_rule(rule);
  Status s = write_step(*faults_, 10, a);
  faults_->clear_rules();
  if (!base_->caps().atomic_rename) {  // an object store: metadata.json is the commit
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
    expect_restores(10, a);
  } else {  // (POSIX: metadata.json is written in the staging directory, renamed after)
    EXPECT_EQ(s.code(), Code::kPermissionDenied) << s.to_string();
    EXPECT_TRUE(steps().empty());
  }
}

TEST_P(EformerWriterTest, OverwriteIsRefusedUnlessAsked) {
  const Data a = make_data(11), b = make_data(22);
  ASSERT_TRUE(write_step(*base_, 10, a).ok());
  auto again = EformerStepWriter::start(*base_, "run-10", 10);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists) << again.status().to_string();
  expect_restores(10, a);

  EformerWriteOptions o;
  o.overwrite = true;
  o.separator = '/';  // a different chunk naming: no chunk of the old step may remain
  ASSERT_TRUE(write_step(*base_, 10, b, o).ok());
  EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
  expect_restores(10, b);
  EXPECT_FALSE(base_->stat("run-10/model/embed/1.1").ok());
  for (const std::string& k : everything()) EXPECT_TRUE(k.starts_with("run-10/")) << k;
}

// On an object store the writer writes under the step's own name, and a
// killed save leaves its objects there without metadata.json. Before, the
// next save of that step (a preempted job that resumed from an older step
// and reached it again) was refused for good ("already exists"). Now the
// writer removes what only the layout's writer could have left; anything
// else there keeps the step refused. On POSIX the writer stages elsewhere:
// a step directory is never its leftover.
TEST_P(EformerWriterTest, AStepASaveNeverFinishedDoesNotBlockTheStep) {
  const bool object_store = !base_->caps().atomic_rename;
  auto put_text = [&](const std::string& key, const std::string& text) {
    return base_->put(key, std::as_bytes(std::span(text.data(), text.size())));
  };
  auto leave_unfinished = [&](const std::string& dir) {
    for (const char* rel : {"/model/embed/.zarray", "/model/embed/0.1", "/model/layers/0/kernel/1.0",
                            "/tensorstore_index.json"})
      ASSERT_TRUE(put_text(dir + rel, "{}").ok()) << rel;
  };
  leave_unfinished("run-10");
  const Data a = make_data(41);
  Status saved = write_step(*base_, 10, a);
  if (object_store) {
    ASSERT_TRUE(saved.ok()) << saved.to_string();
    expect_restores(10, a);
  } else {
    EXPECT_EQ(saved.code(), Code::kAlreadyExists) << saved.to_string();
  }
  // Something not the layout's there: refused everywhere, and kept.
  leave_unfinished("run-11");
  ASSERT_TRUE(put_text("run-11/notes.txt", "mine").ok());
  saved = write_step(*base_, 11, a);
  EXPECT_EQ(saved.code(), Code::kAlreadyExists);
  // (Which says it is no committed step: `ls` shows none there.)
  EXPECT_NE(saved.message().find("holds objects but no committed step"), std::string::npos) << saved.to_string();
  EXPECT_TRUE(base_->stat("run-11/notes.txt").ok());
  // gc leaves steps in eformer's layout alone, finished or not: one in
  // progress may be eformer's own, in another process
  // (GcLeavesEformerStepsAloneCompleteOrNot).
  leave_unfinished("run-12");
  CheckpointManager m(base_, {});
  ASSERT_TRUE(m.gc().ok());
  EXPECT_TRUE(base_->stat("run-12/model/embed/.zarray").ok());
  EXPECT_TRUE(base_->stat("run-11/model/embed/.zarray").ok());
  if (object_store) expect_restores(10, a);
}

TEST_P(EformerWriterTest, AMissingChunkFailsCommitNamingIt) {
  const Data a = make_data(9);
  auto w = EformerStepWriter::start(*base_, "run-10", 10);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto ids = declare(**w);
  // embed's shards are 32 x 16: box 1 is rows [0, 32) x columns [16, 30), chunks 0.1 and 1.1.
  ASSERT_TRUE(write_all(**w, ids, a, "model/embed#1").ok());
  Status c = (*w)->commit();
  EXPECT_EQ(c.code(), Code::kFailedPrecondition) << c.to_string();
  EXPECT_NE(c.message().find("model/embed: chunk 0.1"), std::string::npos) << c.to_string();
  EXPECT_NE(c.message().find("2 of 8 chunks missing"), std::string::npos) << c.to_string();
  EXPECT_TRUE(steps().empty());
  EXPECT_EQ(everything(), std::vector<std::string>{});
  EXPECT_EQ((*w)->commit().code(), Code::kFailedPrecondition);
}

TEST_P(EformerWriterTest, RefusesBoxesOffTheGridAndChunksWrittenTwice) {
  const Data a = make_data(13);
  auto w = EformerStepWriter::start(*base_, "run-10", 10);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto ids = declare(**w);
  const Leaf& embed = leaves()[1];
  const auto& whole = a.at(name_of(embed));
  Box off{{0, 8}, {16, 16}};  // columns [8, 16): not on the 16-column grid
  EXPECT_EQ((*w)->write_box(ids[1], off, cut(embed, whole, off)).code(), Code::kInvalidArgument);
  Box one{{0, 0}, {16, 16}};
  ASSERT_TRUE((*w)->write_box(ids[1], one, cut(embed, whole, one)).ok());
  Status twice = (*w)->write_box(ids[1], one, cut(embed, whole, one));
  EXPECT_EQ(twice.code(), Code::kInvalidArgument);
  EXPECT_NE(twice.message().find("chunk 0.0 was written already"), std::string::npos) << twice.to_string();
  EXPECT_EQ((*w)->write_box(ids[1], one, std::span(whole.data(), 4)).code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->write_box(99, one, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->add_array("model", "embed", DType::kFloat32, {2}, {2}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->add_array("model", "embed.x", DType::kFloat32, {2}, {2}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->add_array("model", "a/b", DType::kFloat32, {2}, {2}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EformerStepWriter::start(*base_, "run-11", 11, {.extra_metadata_json = R"({"step": 3})"})
                .status()
                .code(),
            Code::kInvalidArgument);
}

// An array inside another is refused whatever the order its leaves come in,
// including when a sibling's name sorts between them ("a/b-c" lies between
// "a/b" and "a/b/x" in byte order): the step written so was refused by every
// reader ("array a/b/x lies inside array a/b") after a save that said OK.
TEST(EformerArrayLayout, RefusesAnArrayInsideAnotherInAnyOrder) {
  const std::vector<std::vector<std::string>> orders = {
      {"a.b-c", "a.b.x", "a.b"}, {"a.b-c", "a.b", "a.b.x"}, {"a.b.x", "a.b-c", "a.b"},
      {"a.b", "a.b-c", "a.b.x"}, {"a.b+", "a.b(", "a.b.x.y", "a.b"}, {"a.b", "a.b"}};
  for (const auto& order : orders) {
    zarr::EformerArrayLayout layout(zarr::zstd_level_1(), '.');
    Status last;
    for (const std::string& path : order) {
      last = layout.add("model", path, DType::kFloat32, {2}, {2}).status();
      if (&path != &order.back()) ASSERT_TRUE(last.ok()) << path << ": " << last.to_string();
    }
    EXPECT_EQ(last.code(), Code::kInvalidArgument) << "order ending in " << order.back() << ": " << last.to_string();
  }
  zarr::EformerArrayLayout siblings(zarr::zstd_level_1(), '.');  // names that only share a start
  for (const char* path : {"a.b", "a.b-c", "a.bc", "a.b+", "a.c"})
    EXPECT_TRUE(siblings.add("model", path, DType::kFloat32, {2}, {2}).ok()) << path;
}

TEST_P(EformerWriterTest, SurvivesAPowerCutAfterCommitAndLeavesNoStepBeforeIt) {
  // Every name the step holds must be durable after commit(): the power-cut
  // model drops each object whose directory was not synced after it was
  // written, and undoes renames whose parents were not synced.
  const Data a = make_data(17);
  EformerWriteOptions o;
  o.separator = '/';  // chunk directories of their own (run-10/model/embed/1/)
  auto cut_power = make_fault_storage(base_, {.rename_durable_on_return = false});
  ASSERT_TRUE(write_step(*cut_power, 10, a, o).ok());
  {
    auto w = EformerStepWriter::start(*cut_power, "run-11", 11, o);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    auto ids = declare(**w);
    ASSERT_TRUE(write_all(**w, ids, a).ok());
    ASSERT_TRUE((*w)->flush().ok());  // drop_unsynced wants no operation in flight
    ASSERT_TRUE(cut_power->drop_unsynced().ok());
    EXPECT_EQ(steps(), (std::vector<int64_t>{10}));  // before the writer's abort() cleans up
  }
  EXPECT_EQ(steps(), (std::vector<int64_t>{10}));
  expect_restores(10, a);
}

TEST_P(EformerWriterTest, ChunksLargerThanAnS3PartAreWrittenWhole) {
  // 6.25 MiB chunks, uncompressed: a multipart upload on S3 (5 MiB parts).
  const Leaf big{"model", "big", DType::kFloat32, {1600, 1024}, {800, 1024}, {800, 1024}};
  const std::vector<std::byte> data = testutil::random_bytes(num_bytes(big), 99);
  EformerWriteOptions o;
  o.compressor = zarr::Compressor{zarr::CodecId::kNone};
  o.max_pending_bytes = 8ull << 20;
  auto w = EformerStepWriter::start(*base_, "run-10", 10, o);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto id = (*w)->add_array(big.prefix, big.path, big.dtype, big.shape, big.chunks);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  for (const Box& box : shard_boxes(big)) ASSERT_TRUE((*w)->write_box(*id, box, cut(big, data, box)).ok());
  Status c = (*w)->commit();
  ASSERT_TRUE(c.ok()) << c.to_string();
  auto size = base_->stat("run-10/model/big/1.0");
  ASSERT_TRUE(size.ok()) << size.status().to_string();
  EXPECT_EQ(*size, 800u * 1024 * 4);
  CheckpointManager m(base_, {});
  auto r = m.restore(10);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 1u);
  ASSERT_EQ(r->leaves[0].data.size(), data.size());
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), data.data(), data.size()), 0);
  EXPECT_TRUE(base_->list_unfinished("").ok() && base_->list_unfinished("")->empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, EformerWriterTest, testutil::all_backends(), testutil::backend_name);
INSTANTIATE_TEST_SUITE_P(Backends, EformerWriterZarrPythonTest, ::testing::Values(Backend::kLocal),
                         testutil::backend_name);

}  // namespace
}  // namespace ckptio
