// Saves two steps through an installed libckptio, restores the latest and
// checks it byte for byte. Usage: consumer DIR. Exit 0 on success.
// `consumer --schemes` prints the storage schemes registered, one a line
// ("" for plain paths), and opens an in-memory store through the registry.
#include <ckptio/ckptio.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace ckptio;

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: consumer DIR | --schemes\n"), 2;
  if (std::strcmp(argv[1], "--schemes") == 0) {
    StorageOptions o;
    o.get<S3Options>().region = "us-east-1";  // ckptio/s3.h is installed and usable
    auto mem = open_storage("mem://consumer", o);
    if (!mem.ok()) return std::fprintf(stderr, "open mem://: %s\n", mem.status().to_string().c_str()), 1;
    for (const std::string& s : registered_storage_schemes()) std::printf("%s\n", s.c_str());
    return 0;
  }
  ManagerOptions opts;
  opts.max_to_keep = 1;
  int commits = 0;
  opts.on_commit = [&](const CommitEvent& e) { commits += e.status.ok(); };
  auto mgr = CheckpointManager::open(argv[1], opts);
  if (!mgr.ok()) return std::fprintf(stderr, "open: %s\n", mgr.status().to_string().c_str()), 1;
  std::vector<float> w(1000);
  int32_t count = 0;
  for (int step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f + static_cast<float>(step);
    count = step * 10;
    std::vector<LeafView> state = {
        LeafView::full("model", "params.w", DType::kFloat32, {10, 100}, w.data()),
        LeafView::full("tx", "opt_state.count", DType::kInt32, {}, &count),
    };
    auto h = (*mgr)->save(step, state, {.metadata_json = R"({"from": "consumer"})"});
    if (!h.ok()) return std::fprintf(stderr, "save: %s\n", h.status().to_string().c_str()), 1;
    if (Status st = (*mgr)->wait_until_finished(); !st.ok())
      return std::fprintf(stderr, "save: %s\n", st.to_string().c_str()), 1;
  }
  if (commits != 2) return std::fprintf(stderr, "%d commits, expected 2\n", commits), 1;
  auto r = (*mgr)->restore(std::nullopt);
  if (!r.ok()) return std::fprintf(stderr, "restore: %s\n", r.status().to_string().c_str()), 1;
  if (r->step != 2 || r->leaves.size() != 2) return std::fprintf(stderr, "restored the wrong step\n"), 1;
  for (const Tensor& t : r->leaves) {
    const void* want = t.path == "params.w" ? static_cast<const void*>(w.data()) : &count;
    const size_t n = t.path == "params.w" ? w.size() * sizeof(float) : sizeof count;
    if (t.data.size() != n || std::memcmp(t.data.data(), want, n) != 0)
      return std::fprintf(stderr, "leaf %s differs\n", t.path.c_str()), 1;
  }
  std::printf("consumer: saved steps 1 and 2, restored step 2 bit-exact\n");
  return 0;
}
