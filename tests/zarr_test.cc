// The zarr v2 / eformer layout's readers, writers and chunk codecs
// (src/layout/zarr/), on files written by zarr-python (Debian's python3-zarr
// and python3-numcodecs, run with /usr/bin/python3 when the suite starts)
// and on hostile input. Without zarr-python the fixture tests skip with a
// message saying so (tools/setup-deps installs it; CI never skips).
#include <gtest/gtest.h>

#include <zlib.h>
#include <zstd.h>

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/layout/zarr/chunk_codec.h"
#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/eformer_index.h"
#include "src/layout/zarr/zarray.h"
#include "src/restore/decode_crew.h"
#include "src/util/box_runs.h"

namespace ckptio::zarr {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_file(const fs::path& p, std::string_view s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(s.data(), static_cast<std::streamsize>(s.size()));
}
std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

bool has_control_byte_in(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20) return true;
  return false;
}

// ---- Fixtures written by zarr-python ------------------------------------------

// Writes every case into argv[1]: <name>/ (the zarr array), <name>.raw (the
// array's numpy bytes, C order), <name>.decoded/<chunk key with '/' as '.'>
// (each stored chunk decoded by numcodecs, padding included), cases.json;
// and eformer_index.json / metadata.json as eformer writes them (json.dumps).
constexpr const char* kWriteFixtures = R"PY(
import json, os, sys
import numpy as np
import numcodecs, zarr
from zarr.storage import DirectoryStore

out = sys.argv[1]
rng = np.random.default_rng(29)
cases = []

def write(name, data, chunks, compressor, sep=None, fill_value=0, order="C", dtype_override=None):
    path = os.path.join(out, name)
    store = DirectoryStore(path, dimension_separator=sep) if sep else DirectoryStore(path)
    z = zarr.open_array(store=store, mode="w", shape=data.shape, chunks=chunks, dtype=data.dtype,
                        compressor=compressor, fill_value=fill_value, order=order)
    z[...] = data
    with open(path + ".raw", "wb") as f:
        f.write(np.ascontiguousarray(data).tobytes())
    dec = path + ".decoded"
    os.makedirs(dec)
    for root, _, files in os.walk(path):
        for fn in files:
            if fn.startswith("."):
                continue
            key = os.path.relpath(os.path.join(root, fn), path)
            raw = open(os.path.join(root, fn), "rb").read()
            plain = compressor.decode(raw) if compressor is not None else raw
            with open(os.path.join(dec, key.replace("/", ".")), "wb") as f:
                f.write(bytes(plain))
    if dtype_override:  # as TensorStore writes bfloat16: the same bytes, another dtype name
        meta = json.load(open(os.path.join(path, ".zarray")))
        meta["dtype"] = dtype_override
        json.dump(meta, open(os.path.join(path, ".zarray"), "w"), indent=4, sort_keys=True)
    cases.append({"name": name, "compressor": None if compressor is None else compressor.get_config(),
                  "sep": sep or "."})

normal = lambda shape, dt: rng.standard_normal(shape).astype(dt)
write("zstd_f4_dot", normal((10, 7), "<f4"), (4, 3), numcodecs.Zstd(level=1))
write("zstd_f4_slash", normal((10, 7), "<f4"), (4, 3), numcodecs.Zstd(level=1), sep="/")
write("zstd_f8_nan_fill", normal((5, 6, 7), "<f8"), (2, 4, 3), numcodecs.Zstd(level=3), fill_value=float("nan"))
write("blosc_lz4_i4", rng.integers(-2**31, 2**31, size=(33,), dtype="<i4"), (10,), numcodecs.Blosc())
write("blosc_zstd_bitshuffle_f8", normal((5, 6, 7), "<f8"), (2, 4, 3),
      numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE), sep="/")
write("blosc_blosclz_noshuffle_u1", rng.integers(0, 256, size=(40, 3), dtype="|u1"), (16, 3),
      numcodecs.Blosc(cname="blosclz", clevel=9, shuffle=numcodecs.Blosc.NOSHUFFLE))
write("zlib_u2_slash", rng.integers(0, 2**16, size=(9, 11), dtype="<u2"), (4, 4), numcodecs.Zlib(level=5), sep="/")
write("gzip_i8", rng.integers(-2**63, 2**63, size=(7, 5), dtype="<i8"), (3, 5), numcodecs.GZip(level=6))
write("none_bool", rng.integers(0, 2, size=(9, 4)).astype("|b1"), (4, 4), None, fill_value=False)
write("none_c8", (normal((6,), "<f4") + 1j * normal((6,), "<f4")).astype("<c8"), (4,), None)
write("zstd_f2", normal((3, 50), "<f2"), (2, 16), numcodecs.Zstd(level=1))
write("zstd_i1_fill", rng.integers(-128, 128, size=(17,), dtype="|i1"), (5,), numcodecs.Zstd(level=1), fill_value=-7)
f32 = normal((12, 10), "<f4")
bf16 = (f32.view("<u4") >> 16).astype("<u2")  # bfloat16's bits (truncated): the array as stored
write("zstd_bfloat16", bf16, (8, 4), numcodecs.Zstd(level=1), fill_value=None, dtype_override="bfloat16")
write("scalar_i8", np.array(-5, dtype="<i8"), (), None)
write("order_f_1d", normal((13,), "<f4"), (5,), numcodecs.Zstd(level=1), order="F")
json.dump(cases, open(os.path.join(out, "cases.json"), "w"))

index = {"format": "tensorstore", "version": "0.0.95", "prefixes": {}}
index["prefixes"]["model"] = [
    {"path": "model/layers/0/kernel", "shape": [4096, 1024], "dtype": "bfloat16"},
    {"path": "model/embed", "shape": [], "dtype": "float32"},
]
index["prefixes"]["tx"] = []
index["prefixes"]["mod\u00e8le \U0001F600"] = [{"path": "x/\u00e9/y\"z", "shape": [3], "dtype": "int4"}]
index["arrays"] = [{"path": "step", "shape": [1], "dtype": "int32"}]
open(os.path.join(out, "eformer_index.json"), "w").write(json.dumps(index, indent=2))
open(os.path.join(out, "eformer_index_empty.json"), "w").write(
    json.dumps({"format": "tensorstore", "version": "2.0", "prefixes": {}}, indent=2))
open(os.path.join(out, "metadata.json"), "w").write(
    json.dumps({"step": 1200, "timestamp": "2025-11-02T10:20:30.123456", "is_temporary": False}))
)PY";

// Reads back what ckptio wrote (argv[1]/<name>, a zarr array) with
// zarr-python, and writes its numpy bytes to <name>.read.
constexpr const char* kReadBack = R"PY(
import os, sys
import numpy as np
import zarr
path = sys.argv[1]
z = zarr.open_array(path, mode="r")
open(path + ".read", "wb").write(np.ascontiguousarray(z[...]).tobytes())
)PY";

bool run_python(const fs::path& script, const fs::path& arg, std::string* log) {
  const fs::path out = arg.string() + ".log";
  const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + arg.string() + "' >'" + out.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  *log = read_file(out);
  return rc == 0;
}

class ZarrPython : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ckptio_zarr_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (std::system("/usr/bin/python3 -c 'import zarr, numcodecs' >/dev/null 2>&1") != 0) {
      skip_ = "zarr-python is missing: install python3-zarr and python3-numcodecs (tools/setup-deps does); "
              "the tests on files zarr-python writes are SKIPPED";
      std::fprintf(stderr, "\n*** zarr_test: %s ***\n\n", skip_.c_str());
      return;
    }
    write_file(dir_ / "write.py", kWriteFixtures);
    write_file(dir_ / "read.py", kReadBack);
    std::string log;
    if (!run_python(dir_ / "write.py", dir_ / "fx", &log)) failed_ = "writing the fixtures failed:\n" + log;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failed_.empty()) << failed_;
  }
  static fs::path fx() { return dir_ / "fx"; }

  static inline fs::path dir_;
  static inline std::string skip_, failed_;
};

// Every chunk of one fixture: decoded bit-exactly as numcodecs decodes it,
// then copied through the chunk geometry into the whole array, which must be
// numpy's bytes.
void check_case(const fs::path& root, const std::string& name, ChunkDecoder* decoder) {
  SCOPED_TRACE(name);
  auto a = parse_zarray(read_file(root / name / ".zarray"));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const size_t item = dtype_size(a->dtype);
  auto whole = Box::whole(a->shape);
  const uint64_t n = *checked_num_bytes(a->shape, item);
  const std::string want = read_file(root / (name + ".raw"));
  ASSERT_EQ(want.size(), n);
  std::vector<std::byte> got(n, std::byte{0x5A});
  auto range = chunks_overlapping(*a, whole);
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->count, a->num_chunks);
  uint64_t seen = 0;
  std::vector<std::byte> chunk(a->chunk_bytes);
  for_each_chunk(*range, [&](std::span<const uint64_t> idx) {
    ++seen;
    const std::string key = chunk_key(*a, idx);
    const std::string stored = read_file(root / name / key);
    ASSERT_FALSE(stored.empty()) << key;
    Status s = decoder->decode(a->compressor, bytes_of(stored), chunk);
    ASSERT_TRUE(s.ok()) << key << ": " << s.to_string();
    std::string dkey = key;
    std::replace(dkey.begin(), dkey.end(), '/', '.');
    const std::string numcodecs_bytes = read_file(root / (name + ".decoded") / dkey);
    ASSERT_EQ(numcodecs_bytes.size(), chunk.size()) << key;
    EXPECT_EQ(std::memcmp(numcodecs_bytes.data(), chunk.data(), chunk.size()), 0) << key;
    const Box full = chunk_box(*a, idx), valid = chunk_valid_box(*a, idx);
    EXPECT_TRUE(box_contains(full, valid));
    if (box_is_empty(valid)) return;
    auto layout = run_layout(full, 0, valid, whole, item);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    for_each_run(*layout, [&](uint64_t src, uint64_t dst, uint64_t len) {
      std::memcpy(got.data() + dst, chunk.data() + src, len);
    });
  });
  EXPECT_EQ(seen, a->num_chunks);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n), 0);
}

TEST_F(ZarrPython, EveryFixtureDecodesBitExactly) {
  auto cases = nlohmann::json::parse(read_file(fx() / "cases.json"));
  ASSERT_GE(cases.size(), 15u);
  ChunkDecoder decoder;  // one decoder across codecs: contexts are reused
  for (const auto& c : cases) check_case(fx(), c["name"].get<std::string>(), &decoder);
}

TEST_F(ZarrPython, MetadataAsZarrPythonWritesIt) {
  auto z = parse_zarray(read_file(fx() / "zstd_f4_dot" / ".zarray"));
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(z->compressor.id, CodecId::kZstd);
  EXPECT_EQ(z->compressor.level, 1);
  EXPECT_EQ(z->separator, '.');  // zarr-python leaves dimension_separator out: "."
  EXPECT_EQ(z->grid, (std::vector<uint64_t>{3, 3}));
  EXPECT_EQ(z->chunk_bytes, 4u * 3 * 4);
  EXPECT_EQ(z->fill_value.kind, FillValue::Kind::kFloat);  // zarr-python writes 0.0
  EXPECT_EQ(z->fill_value.f, 0.0);

  auto s = parse_zarray(read_file(fx() / "zstd_f4_slash" / ".zarray"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->separator, '/');
  EXPECT_TRUE(fs::exists(fx() / "zstd_f4_slash" / "2" / "2"));  // edge chunk, full size
  EXPECT_EQ(chunk_key(*s, std::vector<uint64_t>{2, 2}), "2/2");

  auto nan = parse_zarray(read_file(fx() / "zstd_f8_nan_fill" / ".zarray"));
  ASSERT_TRUE(nan.ok());
  EXPECT_EQ(nan->fill_value.kind, FillValue::Kind::kFloat);
  EXPECT_TRUE(std::isnan(nan->fill_value.f));
  EXPECT_EQ(nan->compressor.level, 3);

  auto b = parse_zarray(read_file(fx() / "blosc_lz4_i4" / ".zarray"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->compressor.id, CodecId::kBlosc);
  EXPECT_EQ(b->compressor.cname, "lz4");
  EXPECT_EQ(b->compressor.shuffle, 1);
  EXPECT_EQ(b->compressor.level, 5);

  auto g = parse_zarray(read_file(fx() / "gzip_i8" / ".zarray"));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->compressor.id, CodecId::kGzip);
  EXPECT_EQ(g->compressor.level, 6);

  auto bf = parse_zarray(read_file(fx() / "zstd_bfloat16" / ".zarray"));
  ASSERT_TRUE(bf.ok()) << bf.status().to_string();
  EXPECT_EQ(bf->dtype, DType::kBFloat16);
  EXPECT_EQ(bf->dtype_text, "bfloat16");
  EXPECT_EQ(bf->fill_value.kind, FillValue::Kind::kNull);

  auto sc = parse_zarray(read_file(fx() / "scalar_i8" / ".zarray"));
  ASSERT_TRUE(sc.ok());
  EXPECT_TRUE(sc->shape.empty());
  EXPECT_EQ(sc->num_chunks, 1u);
  EXPECT_EQ(chunk_key(*sc, {}), "0");
  EXPECT_TRUE(fs::exists(fx() / "scalar_i8" / "0"));

  auto f = parse_zarray(read_file(fx() / "order_f_1d" / ".zarray"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();  // order F of rank 1 is C order's bytes
  EXPECT_EQ(f->order, Order::kF);

  auto bl = parse_zarray(read_file(fx() / "none_bool" / ".zarray"));
  ASSERT_TRUE(bl.ok());
  EXPECT_EQ(bl->dtype, DType::kBool);
  EXPECT_EQ(bl->fill_value.kind, FillValue::Kind::kBool);
  EXPECT_EQ(bl->compressor.id, CodecId::kNone);
}

// ckptio writes an array (its .zarray, zstd level 1 chunks, edge chunks
// padded) and zarr-python reads the same values back.
TEST_F(ZarrPython, ZarrPythonReadsWhatCkptioWrites) {
  for (char sep : {'.', '/'}) {
    SCOPED_TRACE(sep);
    auto a = make_zarray({10, 7}, {4, 3}, DType::kFloat32, Compressor{CodecId::kZstd, 1}, sep);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    std::vector<float> values(70);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 3;
    const fs::path dir = dir_ / (sep == '.' ? "ours_dot" : "ours_slash");
    write_file(dir / ".zarray", serialize_zarray(*a));
    const Box whole = Box::whole(a->shape);
    auto range = chunks_overlapping(*a, whole);
    ASSERT_TRUE(range.ok());
    ChunkEncoder enc;
    std::vector<std::byte> encoded;
    for_each_chunk(*range, [&](std::span<const uint64_t> idx) {
      std::vector<std::byte> chunk(a->chunk_bytes, std::byte{0});
      const Box full = chunk_box(*a, idx), valid = chunk_valid_box(*a, idx);
      auto layout = run_layout(whole, 0, valid, full, 4);  // from the array into the chunk
      ASSERT_TRUE(layout.ok());
      for_each_run(*layout, [&](uint64_t src, uint64_t dst, uint64_t len) {
        std::memcpy(chunk.data() + dst, reinterpret_cast<const std::byte*>(values.data()) + src, len);
      });
      ASSERT_TRUE(enc.encode(a->compressor, chunk, &encoded).ok());
      write_file(dir / chunk_key(*a, idx),
                 std::string_view(reinterpret_cast<const char*>(encoded.data()), encoded.size()));
    });
    std::string log;
    ASSERT_TRUE(run_python(dir_ / "read.py", dir, &log)) << log;
    const std::string back = read_file(dir.string() + ".read");
    ASSERT_EQ(back.size(), values.size() * 4);
    EXPECT_EQ(std::memcmp(back.data(), values.data(), back.size()), 0);
  }
}

TEST_F(ZarrPython, EformerIndexAndMetadataAsEformerWritesThem) {
  const std::string text = read_file(fx() / "eformer_index.json");
  auto index = parse_eformer_index(text);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  EXPECT_EQ(index->version, "0.0.95");
  ASSERT_EQ(index->prefixes.size(), 3u);
  EXPECT_EQ(index->prefixes[0].name, "model");
  ASSERT_EQ(index->prefixes[0].arrays.size(), 2u);
  const EformerArray& k = index->prefixes[0].arrays[0];
  EXPECT_EQ(k.path, "model/layers/0/kernel");
  EXPECT_EQ(k.shape, (Shape{4096, 1024}));
  EXPECT_EQ(k.dtype, DType::kBFloat16);
  EXPECT_EQ(key_path_of_array_dir(k.path), "model.layers.0.kernel");
  EXPECT_TRUE(index->prefixes[0].arrays[1].shape.empty());
  EXPECT_TRUE(index->prefixes[1].arrays.empty());
  EXPECT_EQ(index->prefixes[2].name, "mod\u00e8le \U0001F600");
  EXPECT_EQ(index->prefixes[2].arrays[0].dtype_name, "int4");
  EXPECT_FALSE(index->prefixes[2].arrays[0].dtype.has_value());  // no ckptio dtype: kept, not refused
  ASSERT_TRUE(index->arrays.has_value());
  EXPECT_EQ((*index->arrays)[0].path, "step");
  // The writer gives Python's json.dumps(indent=2) text, byte for byte.
  EXPECT_EQ(serialize_eformer_index(*index), text);
  const std::string empty = read_file(fx() / "eformer_index_empty.json");
  auto e = parse_eformer_index(empty);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(serialize_eformer_index(*e), empty);

  const std::string meta = read_file(fx() / "metadata.json");
  auto m = parse_eformer_metadata(meta);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->step, 1200);
  EXPECT_EQ(m->timestamp, "2025-11-02T10:20:30.123456");
  EXPECT_EQ(m->is_temporary, false);
  EXPECT_EQ(serialize_eformer_metadata(*m), meta);
}

// ---- .zarray without Python -------------------------------------------------------

TEST(ZArray, TensorStoresTextIsWhatTheWriterWrites) {
  // The example of issue 29, as TensorStore writes it for JAX.
  const std::string ts =
      R"({"chunks":[256,4096],"compressor":{"id":"zstd","level":1},"dimension_separator":".","dtype":"<f4",)"
      R"("fill_value":null,"filters":null,"order":"C","shape":[1024,4096],"zarr_format":2})";
  auto a = parse_zarray(ts);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->grid, (std::vector<uint64_t>{4, 1}));
  EXPECT_EQ(a->chunk_bytes, 256u * 4096 * 4);
  EXPECT_EQ(serialize_zarray(*a), ts);
  auto made = make_zarray({1024, 4096}, {256, 4096}, DType::kFloat32, Compressor{CodecId::kZstd, 1});
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(serialize_zarray(*made), ts);
  EXPECT_EQ(*made, *a);

  // Every ckptio dtype round-trips through its zarr name.
  for (int t = 0; t < kNumDTypes; ++t) {
    const auto d = static_cast<DType>(t);
    auto m = make_zarray({3, 5}, {2, 5}, d, Compressor{CodecId::kZstd, 3}, '/');
    ASSERT_TRUE(m.ok()) << dtype_name(d);
    auto back = parse_zarray(serialize_zarray(*m));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, *m) << dtype_name(d);
  }
  EXPECT_EQ(zarr_dtype_string(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(zarr_dtype_string(DType::kBool), "|b1");
  EXPECT_EQ(zarr_dtype_string(DType::kFloat8E4M3FN), "float8_e4m3fn");
  // Blosc, and a fill value that needs TensorStore's strings.
  auto b = parse_zarray(
      R"({"chunks":[4],"compressor":{"blocksize":0,"clevel":5,"cname":"lz4","id":"blosc","shuffle":-1},)"
      R"("dtype":"<f2","fill_value":"-Infinity","filters":[],"order":"C","shape":[9],"zarr_format":2,"extra":{"x":1}})");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_TRUE(std::isinf(b->fill_value.f) && b->fill_value.f < 0);
  EXPECT_EQ(parse_zarray(serialize_zarray(*b)).value(), *b);
  auto fill = fill_value_bytes(*b);
  ASSERT_TRUE(fill.ok());
  ASSERT_EQ(fill->size(), 2u);
  EXPECT_EQ(std::to_integer<int>((*fill)[0]), 0x00);  // float16 -inf: 0xFC00
  EXPECT_EQ(std::to_integer<int>((*fill)[1]), 0xFC);
}

TEST(ZArray, ChunkGeometry) {
  auto a = make_zarray({10, 7}, {4, 3}, DType::kInt16, Compressor{});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->num_chunks, 9u);
  const std::vector<uint64_t> edge{2, 2};
  EXPECT_EQ(chunk_key(*a, edge), "2.2");
  EXPECT_EQ(chunk_box(*a, edge), (Box{{8, 6}, {12, 9}}));       // stored full size
  EXPECT_EQ(chunk_valid_box(*a, edge), (Box{{8, 6}, {10, 7}}));  // what it holds
  auto r = chunks_overlapping(*a, Box{{3, 2}, {5, 4}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(r->last, (std::vector<uint64_t>{2, 2}));
  EXPECT_EQ(r->count, 4u);
  std::vector<std::string> keys;
  for_each_chunk(*r, [&](std::span<const uint64_t> i) { keys.push_back(chunk_key(*a, i)); });
  EXPECT_EQ(keys, (std::vector<std::string>{"0.0", "0.1", "1.0", "1.1"}));
  // A callback returning bool stops the walk by returning false.
  keys.clear();
  for_each_chunk(*r, [&](std::span<const uint64_t> i) {
    keys.push_back(chunk_key(*a, i));
    return keys.size() < 3;
  });
  EXPECT_EQ(keys, (std::vector<std::string>{"0.0", "0.1", "1.0"}));
  auto empty = chunks_overlapping(*a, Box{{3, 2}, {3, 4}});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->count, 0u);
  EXPECT_FALSE(chunks_overlapping(*a, Box{{0, 0}, {11, 7}}).ok());
  EXPECT_FALSE(chunks_overlapping(*a, Box{{0}, {1}}).ok());
  // A zero-size dimension: no chunks at all.
  auto z = make_zarray({0, 5}, {1, 5}, DType::kFloat32, Compressor{});
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->num_chunks, 0u);
}

struct Refusal {
  const char* name;
  std::string text;
  Code code;
  const char* says;
};

std::string zarray_with(const std::string& field, const std::string& value) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(
      R"({"chunks":[4,4],"compressor":{"id":"zstd","level":1},"dimension_separator":".","dtype":"<f4",)"
      R"("fill_value":null,"filters":null,"order":"C","shape":[8,8],"zarr_format":2})");
  if (value.empty()) j.erase(field);
  else j[field] = nlohmann::ordered_json::parse(value);
  return j.dump();
}

TEST(ZArray, HostileInputIsRefusedClearly) {
  auto ones = [](int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += i ? ",1" : "1";
    return s + "]";
  };
  const std::vector<Refusal> cases = {
      {"not json", "{\"shape\":", Code::kDataLoss, "invalid JSON"},
      {"not an object", "[1,2]", Code::kDataLoss, "expected a JSON object"},
      {"no shape", zarray_with("shape", ""), Code::kDataLoss, "no \"shape\""},
      {"zarr v3", zarray_with("zarr_format", "3"), Code::kUnimplemented, "is not 2"},
      {"negative shape", zarray_with("shape", "[8,-1]"), Code::kDataLoss, "shape[1]"},
      {"float shape", zarray_with("shape", "[8,1.5]"), Code::kDataLoss, "shape[1]"},
      {"huge shape", zarray_with("shape", "[8,18446744073709551615]"), Code::kDataLoss, "shape[1]"},
      {"zero chunk", zarray_with("chunks", "[4,0]"), Code::kDataLoss, "chunks[1]"},
      {"rank mismatch", zarray_with("chunks", "[4]"), Code::kDataLoss, "rank"},
      {"absurd rank", zarray_with("shape", ones(40)), Code::kUnimplemented, "rank"},
      {"array bytes overflow", zarray_with("shape", "[4611686018427387904,8]"), Code::kDataLoss, "2^64"},
      // (A grid's chunk count never exceeds the array's elements, so this is
      // where a grid whose count would overflow is caught.)
      {"huge grid", zarray_with("shape", "[4294967296,4294967296]"), Code::kDataLoss, "2^64"},
      {"chunk bytes overflow",
       R"({"chunks":[1099511627776,1099511627776],"compressor":null,"dtype":"|u1","fill_value":null,"filters":null,"order":"C","shape":[1,1],"zarr_format":2})",
       Code::kDataLoss, "a chunk of [1099511627776, 1099511627776] holds more than 2^64"},
      {"padded extent past 2^63",
       R"({"chunks":[4611686018427387904],"compressor":null,"dtype":"|u1","fill_value":null,"filters":null,"order":"C","shape":[4611686018427387905],"zarr_format":2})",
       Code::kDataLoss, "2^63"},
      {"chunk above the limit",
       R"({"chunks":[100000,100000,100],"compressor":null,"dtype":"<f8","fill_value":null,"filters":null,"order":"C","shape":[1,1,1],"zarr_format":2})",
       Code::kUnimplemented, "more than the limit"},
      {"unknown dtype", zarray_with("dtype", "\"<x4\""), Code::kDataLoss, "unknown dtype"},
      {"int4", zarray_with("dtype", "\"int4\""), Code::kUnimplemented, "no ckptio dtype"},
      {"big endian", zarray_with("dtype", "\">f4\""), Code::kUnimplemented, "big-endian"},
      {"strings", zarray_with("dtype", "\"<U8\""), Code::kUnimplemented, "strings"},
      {"structured", zarray_with("dtype", R"([["a","<f4"]])"), Code::kUnimplemented, "structured"},
      {"dtype not a string", zarray_with("dtype", "4"), Code::kDataLoss, "dtype must be a string"},
      {"unknown compressor", zarray_with("compressor", R"({"id":"foo"})"), Code::kDataLoss, "unknown compressor"},
      {"lz4 compressor", zarray_with("compressor", R"({"id":"lz4","acceleration":1})"), Code::kUnimplemented, "not supported"},
      {"compressor without id", zarray_with("compressor", R"({"level":1})"), Code::kDataLoss, "no \"id\""},
      {"zstd with an unknown member", zarray_with("compressor", R"({"id":"zstd","level":1,"dict":"x"})"),
       Code::kUnimplemented, "member"},
      {"zstd level 23", zarray_with("compressor", R"({"id":"zstd","level":23})"), Code::kDataLoss, "level"},
      {"blosc cname", zarray_with("compressor", R"({"id":"blosc","cname":"brotli"})"), Code::kDataLoss, "cname"},
      {"blosc shuffle", zarray_with("compressor", R"({"id":"blosc","shuffle":7})"), Code::kDataLoss, "shuffle"},
      {"filters", zarray_with("filters", R"([{"id":"delta","dtype":"<f4"}])"), Code::kUnimplemented, "filters"},
      {"order F", zarray_with("order", "\"F\""), Code::kUnimplemented, "order \"F\""},
      {"order X", zarray_with("order", "\"X\""), Code::kDataLoss, "order"},
      {"separator", zarray_with("dimension_separator", "\"-\""), Code::kDataLoss, "dimension_separator"},
      {"deep", std::string(100, '[') + std::string(100, ']'), Code::kDataLoss, "nested deeper"},
      {"invalid utf-8", zarray_with("order", "\"C\"").replace(2, 0, "\xff"), Code::kDataLoss, "invalid JSON"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = parse_zarray(c.text);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().to_string();
    EXPECT_FALSE(has_control_byte_in(r.status().message()));
  }
  // Fill values that do not fit the dtype.
  auto fill = [](const std::string& dtype, const std::string& fill) {
    auto j = nlohmann::json::parse(zarray_with("dtype", dtype));
    j["fill_value"] = nlohmann::json::parse(fill);
    return parse_zarray(j.dump()).ok();
  };
  EXPECT_TRUE(fill("\"|i1\"", "-128"));
  EXPECT_FALSE(fill("\"|i1\"", "128"));
  EXPECT_FALSE(fill("\"|i1\"", "\"NaN\""));
  EXPECT_FALSE(fill("\"|u1\"", "-1"));
  EXPECT_TRUE(fill("\"<u8\"", "18446744073709551615"));
  EXPECT_FALSE(fill("\"<f4\"", "\"nan\""));
  EXPECT_TRUE(fill("\"<f4\"", "\"Infinity\""));
  EXPECT_FALSE(fill("\"|b1\"", "2"));
  EXPECT_TRUE(fill("\"<c8\"", "[1.5, \"NaN\"]"));
  EXPECT_FALSE(fill("\"<c8\"", "1.5"));
  // Text above the size limit is refused before parsing.
  ZArrayLimits small;
  small.max_bytes = 64;
  auto big = parse_zarray(zarray_with("order", "\"C\""), small);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("limit"), std::string::npos);
}

// ---- Chunk codecs ---------------------------------------------------------------

std::vector<std::byte> sample_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::byte> out(n);
  for (size_t i = 0; i + 4 <= n; i += 4) {
    const float f = normal(rng);
    std::memcpy(out.data() + i, &f, 4);
  }
  return out;
}

std::vector<std::byte> zstd_frame(std::span<const std::byte> src, bool with_size) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, with_size ? 1 : 0);
  std::vector<std::byte> out(ZSTD_compressBound(src.size()));
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  ZSTD_inBuffer i{src.data(), src.size(), 0};
  // Streamed in two parts, so the frame's size is not known up front.
  ZSTD_inBuffer first{src.data(), src.size() / 2, 0};
  ZSTD_compressStream2(c, &o, &first, ZSTD_e_continue);
  i.pos = first.pos;
  while (ZSTD_compressStream2(c, &o, &i, ZSTD_e_end) != 0) {}
  ZSTD_freeCCtx(c);
  out.resize(o.pos);
  return out;
}

TEST(ChunkCodec, ZstdRoundTripAndRefusals) {
  const auto plain = sample_bytes(100'000, 1);
  std::vector<std::byte> enc;
  ASSERT_TRUE(encode_chunk(Compressor{CodecId::kZstd, 1}, plain, &enc).ok());
  EXPECT_EQ(ZSTD_getFrameContentSize(enc.data(), enc.size()), plain.size());
  std::vector<std::byte> out(plain.size());
  ASSERT_TRUE(decode_chunk(Compressor{CodecId::kZstd}, enc, out).ok());
  EXPECT_EQ(out, plain);

  auto refused = [&](std::span<const std::byte> src, size_t want, const char* says) {
    std::vector<std::byte> dst(want);
    Status s = decode_chunk(Compressor{CodecId::kZstd}, src, dst);
    EXPECT_EQ(s.code(), Code::kDataLoss) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.to_string();
  };
  refused(enc, plain.size() - 1, "declare more");
  refused(enc, plain.size() + 1, "declare 100000 bytes, expected 100001");
  refused({}, 0, "empty");
  refused(std::span(enc).first(enc.size() - 3), plain.size(), "truncated or damaged");
  std::vector<std::byte> trailing = enc;
  trailing.push_back(std::byte{1});
  trailing.push_back(std::byte{2});
  refused(trailing, plain.size(), "no valid frame header at byte");
  // A frame that claims a terabyte: refused by its header, before decoding.
  std::vector<std::byte> tb = {std::byte{0x28}, std::byte{0xB5}, std::byte{0x2F}, std::byte{0xFD}, std::byte{0xE0}};
  for (int k = 0; k < 8; ++k) tb.push_back(std::byte{static_cast<unsigned char>(k == 5 ? 0x01 : 0)});  // 2^40
  tb.insert(tb.end(), {std::byte{0x01}, std::byte{0}, std::byte{0}});  // last raw block of 0 bytes
  refused(tb, 4096, "declare more than the 4096 bytes expected");

  // Frames without a declared size (a streaming writer's) are bounded by the decode.
  const auto unsized = zstd_frame(plain, false);
  ASSERT_EQ(ZSTD_getFrameContentSize(unsized.data(), unsized.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  std::fill(out.begin(), out.end(), std::byte{0});
  ASSERT_TRUE(decode_chunk(Compressor{CodecId::kZstd}, unsized, out).ok());
  EXPECT_EQ(out, plain);
  refused(unsized, plain.size() - 1, "decodes to more than");
  refused(unsized, plain.size() + 1, "decodes to 100000 bytes, expected 100001");
  // Several frames, and a skippable one, are one chunk together.
  std::vector<std::byte> two, a, b;
  ASSERT_TRUE(encode_chunk(Compressor{CodecId::kZstd, 1}, std::span(plain).first(40'000), &a).ok());
  ASSERT_TRUE(encode_chunk(Compressor{CodecId::kZstd, 1}, std::span(plain).subspan(40'000), &b).ok());
  const std::byte skippable[] = {std::byte{0x50}, std::byte{0x2A}, std::byte{0x4D}, std::byte{0x18},
                                 std::byte{2},    std::byte{0},    std::byte{0},    std::byte{0},
                                 std::byte{7},    std::byte{7}};
  two.insert(two.end(), a.begin(), a.end());
  two.insert(two.end(), std::begin(skippable), std::end(skippable));
  two.insert(two.end(), b.begin(), b.end());
  std::fill(out.begin(), out.end(), std::byte{0});
  ASSERT_TRUE(decode_chunk(Compressor{CodecId::kZstd}, two, out).ok());
  EXPECT_EQ(out, plain);
  // Damage inside the compressed bytes.
  std::vector<std::byte> damaged = enc;
  for (size_t i = 20; i < damaged.size(); i += 97) damaged[i] ^= std::byte{0x55};
  std::vector<std::byte> dst(plain.size());
  EXPECT_EQ(decode_chunk(Compressor{CodecId::kZstd}, damaged, dst).code(), Code::kDataLoss);
}

TEST(ChunkCodec, EncodeIntoAGivenBufferMatchesEncodeAndNeedsTheBound) {
  const auto plain = sample_bytes(70'000, 3);
  ChunkEncoder e;
  for (CodecId id : {CodecId::kZstd, CodecId::kNone}) {
    const Compressor c{id, 1};
    std::vector<std::byte> want;
    ASSERT_TRUE(e.encode(c, plain, &want).ok());
    auto bound = encoded_bound(c, plain.size());
    ASSERT_TRUE(bound.ok());
    EXPECT_GE(*bound, want.size());
    std::vector<std::byte> dst(*bound, std::byte{0x5A});
    auto n = e.encode_into(c, plain, dst);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    ASSERT_EQ(*n, want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), dst.begin()));
    // One byte short of the bound is refused, whatever the data would need.
    std::vector<std::byte> small(*bound - 1);
    EXPECT_EQ(e.encode_into(c, plain, small).status().code(), Code::kInternal);
  }
}

// Blosc, zlib and gzip frames as numcodecs writes them are exercised by the
// zarr-python fixtures; these are the hostile ones.
TEST(ChunkCodec, BloscZlibGzipNoneRefusals) {
  std::vector<std::byte> dst(1000);
  auto code = [&](CodecId id, std::span<const std::byte> src, size_t want, const char* says) {
    dst.assign(want, std::byte{0});
    Status s = decode_chunk(Compressor{id}, src, dst);
    EXPECT_EQ(s.code(), Code::kDataLoss) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.to_string();
    EXPECT_FALSE(has_control_byte_in(s.message()));
  };
  const std::vector<std::byte> short_header(10, std::byte{1});
  code(CodecId::kBlosc, short_header, 1000, "shorter than a blosc header");
  // A blosc header (version 2, flags memcpyed, typesize 1) claiming 2 GB.
  std::vector<std::byte> hdr = {std::byte{2}, std::byte{1}, std::byte{0x02}, std::byte{1}};
  auto le32 = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) hdr.push_back(std::byte{static_cast<unsigned char>(v >> (8 * k))});
  };
  le32(0x7FFF0000);  // nbytes
  le32(4096);        // blocksize
  le32(32);          // cbytes
  hdr.resize(32, std::byte{0});
  code(CodecId::kBlosc, hdr, 1000, "declares 2147418112 bytes, expected 1000");
  std::vector<std::byte> lies = hdr;
  lies[12] = std::byte{200};  // cbytes past the end
  code(CodecId::kBlosc, lies, 1000, "compressed, the chunk holds");

  const std::string text(1000, 'x');
  code(CodecId::kZlib, {}, 1000, "truncated");
  code(CodecId::kGzip, bytes_of(text), 1000, "damaged");
  code(CodecId::kNone, bytes_of(text), 999, "holds 1000 bytes, expected 999");
  dst.assign(1000, std::byte{0});
  EXPECT_TRUE(decode_chunk(Compressor{CodecId::kNone}, bytes_of(text), dst).ok());
}

// zlib and gzip streams made here with zlib itself: more, fewer and
// trailing bytes.
TEST(ChunkCodec, ZlibBounds) {
  const auto plain = sample_bytes(50'000, 2);
  auto deflate_with = [&](bool gzip) {
    z_stream z{};
    deflateInit2(&z, 6, Z_DEFLATED, gzip ? 16 + 15 : 15, 8, Z_DEFAULT_STRATEGY);
    std::vector<std::byte> out(deflateBound(&z, plain.size()));
    z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(plain.data()));
    z.avail_in = static_cast<uInt>(plain.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
  };
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "zlib");
    const CodecId id = gzip ? CodecId::kGzip : CodecId::kZlib;
    const auto enc = deflate_with(gzip);
    std::vector<std::byte> out(plain.size());
    ASSERT_TRUE(decode_chunk(Compressor{id}, enc, out).ok());
    EXPECT_EQ(out, plain);
    std::vector<std::byte> small(plain.size() - 1), large(plain.size() + 1);
    Status s = decode_chunk(Compressor{id}, enc, small);
    EXPECT_NE(s.message().find("more than"), std::string::npos) << s.to_string();
    s = decode_chunk(Compressor{id}, enc, large);
    EXPECT_NE(s.message().find("decodes to 50000 bytes, expected 50001"), std::string::npos) << s.to_string();
    s = decode_chunk(Compressor{id}, std::span(enc).first(enc.size() - 5), out);
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.to_string();
    auto trailing = enc;
    trailing.push_back(std::byte{0});
    s = decode_chunk(Compressor{id}, trailing, out);
    EXPECT_NE(s.message().find("after the end"), std::string::npos) << s.to_string();
    // The other header kind is refused.
    s = decode_chunk(Compressor{gzip ? CodecId::kZlib : CodecId::kGzip}, enc, out);
    EXPECT_EQ(s.code(), Code::kDataLoss);
  }
}

TEST(ChunkCodec, DecodersRunOnSeveralThreadsAtOnce) {
  const auto plain = sample_bytes(1 << 18, 3);
  std::vector<std::byte> zstd;
  ASSERT_TRUE(encode_chunk(Compressor{CodecId::kZstd, 1}, plain, &zstd).ok());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      ChunkDecoder d;
      std::vector<std::byte> out(plain.size());
      for (int i = 0; i < 50; ++i) {
        std::fill(out.begin(), out.end(), std::byte{0});
        if (!d.decode(Compressor{CodecId::kZstd}, zstd, out).ok() || out != plain) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- eformer's index and metadata ------------------------------------------------

// After a task fails, every task still queued is called with skip = true (a
// restore's tasks give their compressed buffers back there; dropped unrun,
// they left the reader waiting for bytes that never drained) and wait()
// returns the first error.
TEST(DecodeCrewTest, TasksAfterAnErrorAreCalledToSkip) {
  DecodeCrew crew(1);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<int> skipped, ran;
  crew.submit([&](ChunkDecoder*, DecodeCrew::Scratch&, bool skip) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return go; });  // the rest queue up behind it
    (skip ? skipped : ran).push_back(0);
    return Status(Code::kDataLoss, "chunk 0 is damaged");
  });
  for (int i = 1; i <= 4; ++i)
    crew.submit([&, i](ChunkDecoder*, DecodeCrew::Scratch&, bool skip) {
      std::lock_guard lock(mu);
      (skip ? skipped : ran).push_back(i);
      return Status::OK();
    });
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  Status st = crew.wait();
  EXPECT_EQ(st.code(), Code::kDataLoss) << st.to_string();
  std::lock_guard lock(mu);
  EXPECT_EQ(ran, std::vector<int>{0});
  EXPECT_EQ(skipped, (std::vector<int>{1, 2, 3, 4}));
}

// A thread keeps its scratch between chunks up to kKeepScratch, and frees a
// larger one (a restore held threads x its largest chunk to the end).
TEST(DecodeCrewTest, ScratchAboveTheBoundIsFreedBetweenChunks) {
  DecodeCrew crew(1);
  std::vector<size_t> seen;  // the scratch's capacity each task found
  auto task = [&](size_t grow) {
    crew.submit([&seen, grow](ChunkDecoder*, DecodeCrew::Scratch& scratch, bool) {
      seen.push_back(scratch.capacity());
      if (grow) scratch.get(grow);
      return Status::OK();
    });
  };
  task(1 << 20);
  task(DecodeCrew::kKeepScratch + (1 << 20));
  task(0);
  task(0);
  ASSERT_TRUE(crew.wait().ok());
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], 0u);
  EXPECT_GE(seen[1], size_t{1} << 20);  // kept
  EXPECT_EQ(seen[2], 0u);               // freed
  EXPECT_EQ(seen[3], 0u);
}

// The scratch of all threads together stays within the crew's budget: tasks
// whose chunks would pass it wait, and a chunk larger than the budget is
// decoded alone. (Before, 4 threads held 4 chunks at once, whatever their size.)
TEST(DecodeCrewTest, ScratchOfAllThreadsStaysWithinTheBudget) {
  constexpr size_t kBudget = 8u << 20;
  DecodeCrew crew(4, kBudget);
  std::atomic<int> running{0}, most{0}, most_beside_big{0};
  std::atomic<bool> big_running{false};
  auto task = [&](size_t n) {
    crew.submit([&, n](ChunkDecoder*, DecodeCrew::Scratch& scratch, bool) {
      std::span<std::byte> b = scratch.get(n);
      if (b.size() != n) return Status(Code::kInternal, "short scratch");
      const int now = ++running;
      int m = most.load();
      while (now > m && !most.compare_exchange_weak(m, now)) {}
      if (n > kBudget) big_running = true;
      if (big_running) {
        int k = most_beside_big.load();
        while (now > k && !most_beside_big.compare_exchange_weak(k, now)) {}
      }
      std::memset(b.data(), 1, b.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      if (n > kBudget) big_running = false;
      --running;
      return Status::OK();
    });
  };
  for (int i = 0; i < 8; ++i) task(3u << 20);  // two fit in 8 MiB, three do not
  task(20u << 20);                              // larger than the budget: alone
  for (int i = 0; i < 4; ++i) task(3u << 20);
  ASSERT_TRUE(crew.wait().ok());
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(most_beside_big.load(), 1);
  EXPECT_EQ(crew.scratch_peak(), size_t{20} << 20);  // the big one, alone
}

TEST(EformerIndex, PathsStayInsideTheStep) {
  EXPECT_TRUE(check_array_path("model/layers/0/kernel").ok());
  EXPECT_TRUE(check_array_path("a..b/c").ok());  // ".." inside a name is a name
  for (const char* bad : {"", "/abs", "a/../b", "..", "a//b", "./a", "a/.", "a\\b", "a/", "a\nb"}) {
    Status s = check_array_path(bad);
    EXPECT_EQ(s.code(), Code::kDataLoss) << bad;
    EXPECT_FALSE(has_control_byte_in(s.message()));
  }
  EXPECT_EQ(array_dir_of_key_path("model.layers.0.kernel").value(), "model/layers/0/kernel");
  EXPECT_FALSE(array_dir_of_key_path("model..kernel").ok());
  EXPECT_FALSE(array_dir_of_key_path(".model").ok());
  EXPECT_EQ(key_path_of_array_dir("tx/0/mu/w"), "tx.0.mu.w");
  EXPECT_EQ(prefix_of_index_name("model_tensorstore_index.json"), "model");
  EXPECT_EQ(prefix_of_index_name("tensorstore_index.json"), std::nullopt);
  EXPECT_EQ(prefix_of_index_name("_tensorstore_index.json"), std::nullopt);
  EXPECT_EQ(prefix_of_index_name("a/b_tensorstore_index.json"), std::nullopt);
}

TEST(EformerIndex, HostileIndexesAreRefused) {
  auto with = [](const std::string& arrays) {
    return R"({"format":"tensorstore","version":"0.1.0","prefixes":{"model":)" + arrays + "}}";
  };
  const std::vector<std::pair<std::string, const char*>> cases = {
      {R"({"format":"ckptio","prefixes":{}})", "is not \"tensorstore\""},
      {R"({"prefixes":{}})", "is not \"tensorstore\""},
      {with(R"([{"path":"../../etc/passwd","shape":[1],"dtype":"float32"}])"), "\"..\""},
      {with(R"([{"path":"/etc/x","shape":[1],"dtype":"float32"}])"), "absolute"},
      {with(R"([{"path":"a\\b","shape":[1],"dtype":"float32"}])"), "backslash"},
      {with(R"([{"path":"a//b","shape":[1],"dtype":"float32"}])"), "empty component"},
      {with(R"([{"path":"","shape":[1],"dtype":"float32"}])"), "is empty"},
      {with(R"([{"path":"a","shape":[-1],"dtype":"float32"}])"), "integer >= 0"},
      {with(R"([{"path":"a","shape":[4611686018427387904,4],"dtype":"float32"}])"), "overflow"},
      {with(R"([{"path":"a","shape":[1]}])"), "no \"dtype\""},
      {with(R"([{"path":"a","dtype":"float32"}])"), "no \"shape\""},
      {with(R"([{"path":"a","shape":[1],"dtype":"float32"},{"path":"a","shape":[1],"dtype":"float32"}])"),
       "two arrays in one directory"},
      {with(R"([{"path":"a/b","shape":[1],"dtype":"float32"},{"path":"a/b/c","shape":[1],"dtype":"float32"}])"),
       "lies inside array"},
      {with(R"([{"path":"a/b","shape":[1],"dtype":"float32"},{"path":"a/b-c","shape":[1],"dtype":"float32"},)"
            R"({"path":"a/b/c","shape":[1],"dtype":"float32"}])"),
       "lies inside array"},
      {with(R"({"path":"a"})"), "must be a list"},
      {R"({"format":"tensorstore","prefixes":{"..":[]}})", "bad prefix name"},
      {R"({"format":"tensorstore","prefixes":[]})", "must be an object"},
      {std::string(50, '{'), "nested deeper"},
      {"{\"format\":\"tensorstore\"", "invalid JSON"},
  };
  for (const auto& [text, says] : cases) {
    SCOPED_TRACE(text);
    auto r = parse_eformer_index(text);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kDataLoss);
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().to_string();
    EXPECT_FALSE(has_control_byte_in(r.status().message()));
  }
  // Across prefixes too: one directory, two arrays.
  auto across = parse_eformer_index(
      R"({"format":"tensorstore","prefixes":{"a":[{"path":"x/y","shape":[],"dtype":"int32"}]},)"
      R"("arrays":[{"path":"x/y","shape":[],"dtype":"int32"}]})");
  EXPECT_FALSE(across.ok());
  EformerIndexLimits few;
  few.max_arrays = 1;
  EXPECT_FALSE(parse_eformer_index(with(R"([{"path":"a","shape":[1],"dtype":"float32"},)"
                                        R"({"path":"b","shape":[1],"dtype":"float32"}])"),
                                   few)
                   .ok());
}

TEST(EformerIndex, OlderPerPrefixFilesAndRoundTrips) {
  auto old = parse_eformer_prefix_index(
      "model", R"({"format":"tensorstore","version":"1.0","arrays":[{"path":"model/w","shape":[2,3],"dtype":"float16"}]})");
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  ASSERT_EQ(old->prefixes.size(), 1u);
  EXPECT_EQ(old->prefixes[0].name, "model");
  EXPECT_EQ(old->prefixes[0].arrays[0].dtype, DType::kFloat16);
  EXPECT_FALSE(old->arrays.has_value());
  EXPECT_FALSE(parse_eformer_prefix_index(
                   "model", R"({"format":"tensorstore","prefixes":{"tx":[]}})")
                   .ok());

  EformerIndex idx;
  idx.version = "0.1.0";
  idx.prefixes.push_back({"model", {{"model/a", {2, 3}, "bfloat16", DType::kBFloat16}, {"model/s", {}, "int32", DType::kInt32}}});
  const std::string text = serialize_eformer_index(idx);
  auto back = parse_eformer_index(text);
  ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
  EXPECT_EQ(*back, idx);

  auto m = parse_eformer_metadata(R"({"step": 7, "timestamp": "2026-01-01T00:00:00+00:00", "is_temporary": true, "has_optimizer_state": true})");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->is_temporary, true);
  auto partial = parse_eformer_metadata(R"({"has_optimizer_state": true})");
  ASSERT_TRUE(partial.ok());
  EXPECT_FALSE(partial->step.has_value());
  EXPECT_FALSE(parse_eformer_metadata(R"({"step": "7"})").ok());
  EXPECT_FALSE(parse_eformer_metadata(R"({"step": 1.5})").ok());
  EXPECT_FALSE(parse_eformer_metadata(R"({"is_temporary": 1})").ok());
  EXPECT_FALSE(parse_eformer_metadata(R"([1])").ok());
  EXPECT_EQ(serialize_eformer_metadata({7, "t", false}), R"({"step": 7, "timestamp": "t", "is_temporary": false})");
}

}  // namespace
}  // namespace ckptio::zarr
