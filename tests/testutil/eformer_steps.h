// Steps in eformer's layout written by zarr-python as TensorStore writes
// them, for the tests that read them (eformer_step_test.cc):
// run-100 and run-200 complete, run-300 without metadata.json (in progress).
// Leaves (prefix/path: dtype shape, chunks, codec):
//   model/layers.0.kernel  bfloat16 [64, 48], [16, 48] row bands, zstd 1
//   model/layers.0.bias    float32 [48], one chunk, zstd 1
//   model/embed            float32 [50, 30], [16, 16] (padded edges), zstd 1, '/' separator
//   tx/mu.kernel           float32 [64, 48], [32, 24], blosc
//   tx/count               int32 scalar, no compressor
//   tx/nu                  uint16 [9, 11], [4, 4], zlib 5, '/' separator
// Run with /usr/bin/python3 SCRIPT BASE EXPECTED.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <system_error>

namespace ckptio::testutil {

// argv[1]: the base directory to write steps into; argv[2]: where to put each
// leaf's expected bytes, <step>/<prefix>/<leaf path>.raw (C order).
inline constexpr const char* kWriteEformerSteps = R"PY(
import datetime, json, os, sys
import numpy as np
import numcodecs, zarr
from zarr.storage import DirectoryStore

base, expected = sys.argv[1], sys.argv[2]

def write_array(step_dir, path, data, chunks, compressor, sep=".", dtype_name=None):
    p = os.path.join(step_dir, path)
    store = DirectoryStore(p, dimension_separator=sep)
    z = zarr.open_array(store=store, mode="w", shape=data.shape, chunks=chunks, dtype=data.dtype,
                        compressor=compressor, fill_value=None)
    z[...] = data
    meta = json.load(open(os.path.join(p, ".zarray")))
    if dtype_name:
        meta["dtype"] = dtype_name
    meta["dimension_separator"] = sep
    open(os.path.join(p, ".zarray"), "w").write(json.dumps(meta, sort_keys=True, separators=(",", ":")))

def write_step(step, complete=True):
    rng = np.random.default_rng(step)
    step_dir = os.path.join(base, "run-%d" % step)
    f32 = lambda shape: rng.standard_normal(shape).astype("<f4")
    kernel32 = f32((64, 48))
    leaves = {
        # prefix, ckptio leaf path, zarr dir, data, chunks, compressor, sep, dtype name
        "model/layers.0.kernel": ("model", "model/layers/0/kernel", (kernel32.view("<u4") >> 16).astype("<u2"),
                                  (16, 48), numcodecs.Zstd(level=1), ".", "bfloat16"),
        "model/layers.0.bias": ("model", "model/layers/0/bias", f32((48,)), (48,), numcodecs.Zstd(level=1), ".", None),
        "model/embed": ("model", "model/embed", f32((50, 30)), (16, 16), numcodecs.Zstd(level=1), "/", None),
        "tx/mu.kernel": ("tx", "tx/mu/kernel", f32((64, 48)), (32, 24), numcodecs.Blosc(), ".", None),
        "tx/count": ("tx", "tx/count", np.array(step, dtype="<i4"), (), None, ".", None),
        "tx/nu": ("tx", "tx/nu", rng.integers(0, 2**16, size=(9, 11), dtype="<u2"), (4, 4), numcodecs.Zlib(level=5),
                  "/", None),
    }
    index = {"format": "tensorstore", "version": "0.0.95", "prefixes": {}}
    for name, (prefix, path, data, chunks, comp, sep, dtype_name) in leaves.items():
        write_array(step_dir, path, data, chunks, comp, sep, dtype_name)
        index["prefixes"].setdefault(prefix, []).append(
            {"path": path, "shape": list(data.shape), "dtype": dtype_name or str(data.dtype)})
        out = os.path.join(expected, str(step), name + ".raw")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        open(out, "wb").write(np.ascontiguousarray(data).tobytes())
    open(os.path.join(step_dir, "tensorstore_index.json"), "w").write(json.dumps(index, indent=2))
    if complete:
        json.dump({"step": step, "timestamp": datetime.datetime(2025, 11, 2, 10, 0, step % 60).isoformat(),
                   "is_temporary": False}, open(os.path.join(step_dir, "metadata.json"), "w"))

write_step(100)
write_step(200)
write_step(300, complete=False)  # a save in progress: no metadata.json yet
)PY";

// The steps kWriteEformerSteps writes: <dir>/base (the steps) and
// <dir>/expected (each leaf's bytes). Written once per script text and user
// into the temporary directory and shared by every test process after that
// (each test started Python twice, ~3 s, before). The files are made in a
// directory of their own and renamed into place whole, so that tests running
// side by side never see a half-written set; tests must not change them.
// On failure returns an empty path with zarr-python's log in *error, and
// *missing set when zarr-python or numcodecs cannot be imported.
inline std::filesystem::path eformer_steps_fixture(std::string* error, bool* missing) {
  namespace fs = std::filesystem;
  const std::string script = kWriteEformerSteps;
  char tag[40];
  std::snprintf(tag, sizeof tag, "%016zx-%u", std::hash<std::string>{}(script), static_cast<unsigned>(::getuid()));
  const fs::path dir = fs::temp_directory_path() / ("ckptio-eformer-steps-" + std::string(tag));
  *missing = false;
  if (fs::is_directory(dir / "expected")) return dir;
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp / "base");
  { std::ofstream(tmp / "write.py") << script; }
  const std::string cmd = "/usr/bin/python3 '" + (tmp / "write.py").string() + "' '" + (tmp / "base").string() +
                          "' '" + (tmp / "expected").string() + "' >'" + (tmp / "log").string() + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream in(tmp / "log");
    *error = std::string(std::istreambuf_iterator<char>(in), {});
    *missing = error->find("No module named") != std::string::npos;
    fs::remove_all(tmp);
    return {};
  }
  fs::remove(tmp / "write.py");
  fs::remove(tmp / "log");
  std::error_code ec;
  fs::rename(tmp, dir, ec);  // another test may have put its own there first: keep that one
  if (ec) fs::remove_all(tmp);
  return dir;
}

}  // namespace ckptio::testutil
