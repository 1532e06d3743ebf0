// End-to-end tests of the `ckptio` command-line tool: each test runs the
// binary (CKPTIO_CLI_PATH) in a fresh temporary directory and checks its exit
// code, its JSON output and what it did on disk.
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <set>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "ckptio/index.h"
#include "testutil/cli_runner.h"

namespace {

namespace fs = std::filesystem;
using ckptio::testutil::CliResult;
using ckptio::testutil::run_cli;
using ckptio::testutil::show;
using nlohmann::json;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(CKPTIO_CLI_PATH)) << "the ckptio binary is not built: " << CKPTIO_CLI_PATH;
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ckptio-cli-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Runs the CLI and expects `code`.
  CliResult run(const std::vector<std::string>& args, int code = 0) {
    CliResult r = run_cli(args);
    EXPECT_EQ(r.code, code) << show(args, r);
    return r;
  }
  json run_json(const std::vector<std::string>& args, int code = 0) {
    CliResult r = run(args, code);
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << show(args, r);
    return j;
  }
  void synth_save(int step, const std::string& bytes, int leaves,
                  const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"synth", "save", dir_, "--step", std::to_string(step),
                                     "--bytes", bytes, "--leaves", std::to_string(leaves)};
    args.insert(args.end(), extra.begin(), extra.end());
    run(args);
  }
  std::string step_dir(int step) const { return dir_ + "/run-" + std::to_string(step); }

  std::string dir_;
};

// One line on stderr, "ckptio: ..." (no stack trace, no abort).
void expect_one_error_line(const CliResult& r) {
  EXPECT_EQ(r.err.rfind("ckptio: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST_F(CliTest, SynthSaveThenLsInspectAndCheck) {
  synth_save(1, "4MiB", 40);

  json ls = run_json({"ls", dir_, "--json"});
  ASSERT_TRUE(ls.is_array());
  ASSERT_EQ(ls.size(), 1u) << ls.dump();
  EXPECT_EQ(ls[0]["step"], 1);
  EXPECT_EQ(ls[0]["committed"], true);
  EXPECT_GT(ls[0]["bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(ls[0]["path"], step_dir(1));
  EXPECT_TRUE(ls[0]["committed_at"].is_string());

  json in = run_json({"inspect", dir_, "--json"});
  EXPECT_EQ(in["step"], 1);
  ASSERT_TRUE(in["leaves"].is_array());
  ASSERT_EQ(in["leaves"].size(), 40u);
  uint64_t total = 0;
  std::set<std::string> prefixes;
  for (const json& leaf : in["leaves"]) {
    for (const char* key : {"prefix", "path", "dtype", "shape", "bytes", "shards"})
      EXPECT_TRUE(leaf.contains(key)) << key << " missing in " << leaf.dump();
    EXPECT_TRUE(leaf["shape"].is_array());
    EXPECT_EQ(leaf["shards"], 1);
    prefixes.insert(leaf["prefix"].get<std::string>());
    total += leaf["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(prefixes, (std::set<std::string>{"model", "tx"}));
  EXPECT_LE(total, 4u << 20);
  EXPECT_GT(total, 3u << 20);  // close to the size asked for
  EXPECT_EQ(in["metadata"]["synth"]["leaves"], 40);
  EXPECT_EQ(in["metadata"]["synth"]["generator"], "splitmix64-v1");
  EXPECT_EQ(in["leaves"][0]["path"], "params.embed.embedding");

  CliResult human = run({"inspect", dir_});
  EXPECT_NE(human.out.find("params.embed.embedding"), std::string::npos);
  EXPECT_NE(human.out.find("bfloat16"), std::string::npos);
  EXPECT_NE(human.out.find("opt_state.count"), std::string::npos);

  CliResult check = run({"synth", "check", dir_});
  EXPECT_NE(check.out.find("bit for bit"), std::string::npos) << check.out;
  json cj = run_json({"synth", "check", dir_, "--step", "1", "--json"});
  EXPECT_EQ(cj["verified"], true);
  EXPECT_EQ(cj["step"], 1);
  EXPECT_EQ(cj["bytes"], total);
  EXPECT_TRUE(cj["restore_gbps"].is_number());

  run({"verify", dir_});
  run({"verify", dir_, "--all"});
}

TEST_F(CliTest, LeafCountsAndSizesAtTheEdges) {
  synth_save(1, "0", 1);
  synth_save(2, "1000", 2);
  synth_save(3, "64KiB", 5, {"--seed", "7"});
  synth_save(4, "1MB", 2000);
  int step = 1;
  for (size_t want : {1u, 2u, 5u, 2000u}) {
    json in = run_json({"inspect", dir_, "--step", std::to_string(step), "--json"});
    EXPECT_EQ(in["leaves"].size(), want) << "step " << step;
    run({"synth", "check", dir_, "--step", std::to_string(step)});
    ++step;
  }
}

// A SIZE with a decimal fraction is exact: "16.777216MB" is 16 MiB, not one
// byte less (the fraction was summed in floating point), so it passes as
// --s3-part-size, a multiple of 4096. The synth metadata records the SIZE
// --bytes gave.
TEST_F(CliTest, FractionalSizesAreExact) {
  int step = 1;
  for (auto [text, want] : {std::pair{"2.097152MB", 2097152u}, std::pair{"1.000001MB", 1000001u},
                            std::pair{"0.029KB", 29u}, std::pair{"1.5KiB", 1536u}}) {
    synth_save(step, text, 2);
    json in = run_json({"inspect", dir_, "--step", std::to_string(step), "--json"});
    EXPECT_EQ(in["metadata"]["synth"]["bytes"], want) << text;
    ++step;
  }
}

TEST_F(CliTest, BorrowStagingAndStepFormat) {
  synth_save(5, "3MiB", 12, {"--staging", "borrow", "--step-format", "{step}"});
  json ls = run_json({"ls", dir_, "--json", "--step-format", "{step}"});
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0]["name"], "5");
  run({"--step-format", "{step}", "synth", "check", dir_});
  // Under the default format the step is invisible.
  run({"synth", "check", dir_}, 3);
}

TEST_F(CliTest, SaveRefusesACommittedStepWithoutOverwrite) {
  synth_save(1, "1MiB", 8);
  CliResult r = run({"synth", "save", dir_, "--step", "1", "--bytes", "1MiB"}, 1);
  expect_one_error_line(r);
  EXPECT_NE(r.err.find("--overwrite"), std::string::npos);
  synth_save(1, "2MiB", 9, {"--overwrite", "--seed", "3"});
  json in = run_json({"inspect", dir_, "--json"});
  EXPECT_EQ(in["leaves"].size(), 9u);
  run({"synth", "check", dir_});
}

// Finds the leaf holding byte `at` of `file` in a step's index.
std::string leaf_at(const std::string& step_dir, const std::string& file, uint64_t at) {
  std::ifstream in(step_dir + "/" + ckptio::kIndexFileName);
  std::stringstream text;
  text << in.rdbuf();
  auto index = ckptio::parse_index(text.str());
  if (!index.ok()) return "unparseable index: " + index.status().to_string();
  for (const auto& p : index->prefixes)
    for (const auto& l : p.leaves)
      for (const auto& s : l.shards)
        if (s.file == file && at >= s.offset && at < s.offset + s.length) return p.name + "/" + l.path;
  return "";
}

TEST_F(CliTest, FlippedByteFailsVerifyAndCheckNamingTheLeaf) {
  synth_save(1, "2MiB", 10);
  std::string data;
  for (const auto& e : fs::directory_iterator(step_dir(1))) {
    const std::string name = e.path().filename();
    if (name.rfind("data-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".bin")
      data = name;
  }
  ASSERT_FALSE(data.empty()) << "no data-*.bin in " << step_dir(1);
  const std::string path = step_dir(1) + "/" + data;
  const uint64_t at = fs::file_size(path) / 2;
  const std::string leaf = leaf_at(step_dir(1), data, at);
  ASSERT_FALSE(leaf.empty());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  }

  CliResult v = run({"verify", dir_}, 1);
  EXPECT_NE(v.err.find(leaf), std::string::npos) << "verify does not name " << leaf << ": " << v.err;
  EXPECT_NE(v.err.find("checksum"), std::string::npos) << v.err;
  expect_one_error_line(v);

  CliResult all = run({"verify", dir_, "--all"}, 1);
  EXPECT_NE(all.err.find(leaf), std::string::npos) << all.err;

  CliResult c = run({"synth", "check", dir_}, 1);
  EXPECT_NE(c.err.find(leaf), std::string::npos) << "synth check does not name " << leaf << ": " << c.err;
  EXPECT_NE(c.err.find("element"), std::string::npos) << c.err;
  expect_one_error_line(c);

  json cj = run_json({"synth", "check", dir_, "--json"}, 1);
  EXPECT_EQ(cj["verified"], false);
}

TEST_F(CliTest, DamagedIndexIsReportedByLsAndVerifyAll) {
  synth_save(1, "256KiB", 5);
  synth_save(2, "256KiB", 5);
  std::ofstream(step_dir(2) + "/" + ckptio::kIndexFileName, std::ios::trunc) << "{garbage";
  json ls = run_json({"ls", dir_, "--json"});
  ASSERT_EQ(ls.size(), 2u) << ls.dump();
  EXPECT_EQ(ls[1]["state"], "damaged");
  EXPECT_EQ(ls[1]["committed"], false);
  CliResult all = run({"verify", dir_, "--all"}, 1);
  EXPECT_NE(all.out.find("step 1: ok"), std::string::npos) << all.out;
  EXPECT_NE(all.err.find("run-2"), std::string::npos) << all.err;
  run({"inspect", dir_, "--step", "2"}, 1);
  run({"synth", "check", dir_, "--step", "1"});
}

// A damaged newest step is kept by retention but not counted among the
// steps to keep: before, `gc --keep-last 1` kept the damaged step 3 (it
// counted as the newest) and deleted steps 1 and 2, exit 0, leaving no
// intact step at all. The other commands say damage, not "nothing here".
TEST_F(CliTest, ADamagedNewestStepIsNotCountedAmongTheStepsKept) {
  synth_save(1, "64KiB", 5);
  synth_save(2, "64KiB", 5);
  synth_save(3, "64KiB", 5);
  fs::resize_file(step_dir(3) + "/" + ckptio::kIndexFileName, 100);
  run({"gc", dir_, "--keep-last", "1"});
  EXPECT_FALSE(fs::exists(step_dir(1)));
  EXPECT_TRUE(fs::exists(step_dir(2))) << "the newest intact step was deleted";
  EXPECT_TRUE(fs::exists(step_dir(3))) << "a damaged step is left for a human";
  run({"synth", "check", dir_});
  // verify --step of a damaged step: its JSON report, exit 1 (before: no JSON).
  json v = run_json({"verify", dir_, "--step", "3", "--json"}, 1);
  EXPECT_EQ(v["ok"], false) << v.dump();
  EXPECT_EQ(v["step"], 3) << v.dump();
  run({"verify", dir_, "--step", "4", "--json"}, 3);
  // Only damaged steps left: inspect fails naming the damage (exit 1), it
  // does not say "no committed step" (exit 3).
  fs::remove_all(step_dir(2));
  CliResult in = run({"inspect", dir_}, 1);
  EXPECT_NE(in.err.find("no intact committed step"), std::string::npos) << in.err;
  EXPECT_NE(in.err.find("step 3"), std::string::npos) << in.err;
}

// Names from outside: a directory whose name is not UTF-8, and a leaf whose
// name holds a terminal's escape sequences. --json prints JSON (before:
// nlohmann's type_error 316, exit 1, after a save that committed), and the
// tables and messages quote control bytes instead of sending them raw.
TEST_F(CliTest, NamesFromOutsideNeitherBreakTheJsonNorReachTheTerminalRaw) {
  const std::string odd = dir_ + "/caf\xe9";
  json saved = run_json({"synth", "save", odd, "--step", "7", "--bytes", "64KiB", "--leaves", "3", "--json"});
  EXPECT_EQ(saved["step"], 7) << saved.dump();
  json ls = run_json({"ls", odd, "--json"});
  ASSERT_EQ(ls.size(), 1u) << ls.dump();
  EXPECT_NE(ls[0]["path"].get<std::string>().find("\xef\xbf\xbd"), std::string::npos) << ls.dump();
  run_json({"gc", odd, "--min-age", "0", "--json"});

  synth_save(1, "64KiB", 3);
  const std::string index = step_dir(1) + "/" + ckptio::kIndexFileName;
  std::ifstream in(index);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string from = "\"path\": \"opt_state.count\"";
  ASSERT_NE(text.find(from), std::string::npos) << text;
  text.replace(text.find(from), from.size(), "\"path\": \"opt_state.\\u001b]0;pwned\\u0007\\u001b[2Jcount\"");
  std::ofstream(index, std::ios::trunc) << text;
  CliResult table = run({"inspect", dir_});
  EXPECT_EQ(table.out.find('\x1b'), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find('\x07'), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("\\x1B[2Jcount"), std::string::npos) << table.out;
  json j = run_json({"inspect", dir_, "--json"});
  bool found = false;
  for (const auto& l : j["leaves"]) found = found || l["path"] == "opt_state.\x1b]0;pwned\x07\x1b[2Jcount";
  EXPECT_TRUE(found) << "the JSON keeps the name exactly (escaped by JSON): " << j.dump();
}

// The data file of a step, by name.
std::string data_file_of(const std::string& step_dir) {
  for (const auto& e : fs::directory_iterator(step_dir)) {
    const std::string name = e.path().filename();
    if (name.rfind("data-", 0) == 0) return name;
  }
  return "";
}

// The library's log (src/util/log.h) reaches stderr through the CLI's
// logger, at the level --log-level chooses (default warn).
TEST_F(CliTest, TheLibrarysLogReachesStderrAtTheChosenLevel) {
  CliResult quiet = run({"synth", "save", dir_, "--step", "1", "--bytes", "64KiB", "--leaves", "3"});
  EXPECT_EQ(quiet.err.find("committed step"), std::string::npos) << quiet.err;
  CliResult loud = run({"--log-level", "debug", "synth", "save", dir_, "--step", "2", "--bytes", "64KiB",
                        "--leaves", "3"});
  EXPECT_NE(loud.err.find("[debug] ckptio: committed step 2 ("), std::string::npos) << loud.err;
  CliResult off = run({"--log-level", "off", "synth", "save", dir_, "--step", "3", "--bytes", "64KiB",
                       "--leaves", "3"});
  EXPECT_EQ(off.err.find("committed step"), std::string::npos) << off.err;
}

TEST_F(CliTest, SynthCheckSkipsDamagedStepsAndSaysSoUnlessStrict) {
  synth_save(1, "256KiB", 5);
  synth_save(2, "256KiB", 5);
  synth_save(3, "256KiB", 5);
  // Step 3: data file deleted; step 2: index damaged.
  const std::string data3 = data_file_of(step_dir(3));
  ASSERT_FALSE(data3.empty());
  fs::remove(step_dir(3) + "/" + data3);
  std::ofstream(step_dir(2) + "/" + ckptio::kIndexFileName, std::ios::trunc) << "{\"format\": \"ckptio\", \"vers";

  CliResult c = run({"synth", "check", dir_});
  EXPECT_NE(c.out.find("step 3: skipped, damaged: DataLoss: restore "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("run-3/" + data3 + " is missing"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("step 2: skipped, damaged: DataLoss: " + step_dir(2) + "/" + ckptio::kIndexFileName),
            std::string::npos) << c.out;
  EXPECT_NE(c.out.find("step 1: "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("restored step 1 after skipping damaged step(s) 3, 2"), std::string::npos) << c.out;

  json j = run_json({"synth", "check", dir_, "--json"});
  EXPECT_EQ(j["step"], 1);
  EXPECT_EQ(j["verified"], true);
  ASSERT_EQ(j["skipped"].size(), 2u) << j.dump();
  EXPECT_EQ(j["skipped"][0]["step"], 3);
  EXPECT_EQ(j["skipped"][1]["step"], 2);
  EXPECT_NE(j["skipped"][0]["error"].get<std::string>().find(data3 + " is missing"), std::string::npos);

  // Strict, or an explicit step: the damage is the error.
  CliResult strict = run({"--strict", "synth", "check", dir_}, 1);
  expect_one_error_line(strict);
  EXPECT_NE(strict.err.find("run-3/" + data3 + " is missing"), std::string::npos) << strict.err;
  expect_one_error_line(run({"synth", "check", dir_, "--step", "3"}, 1));

  // verify never skips: the newest step is the one checked.
  CliResult v = run({"verify", dir_}, 1);
  EXPECT_NE(v.out.find("step 3: FAILED"), std::string::npos) << v.out;
  EXPECT_NE(v.err.find("data file " + step_dir(3) + "/" + data3 + " is missing"), std::string::npos) << v.err;
  expect_one_error_line(v);

  // Every step damaged: one error naming each.
  fs::remove(step_dir(1) + "/" + data_file_of(step_dir(1)));
  CliResult all = run({"synth", "check", dir_}, 1);
  expect_one_error_line(all);
  EXPECT_NE(all.err.find("every committed step at " + dir_ + " is damaged; step 3: "), std::string::npos) << all.err;
  EXPECT_NE(all.err.find("; step 1: "), std::string::npos) << all.err;
}

// Root bypasses file permissions through CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH; the CLI child drops both from its bounding set before
// exec, so that root's ckptio meets mode 000 like anyone else's.
void drop_dac_capabilities() {
  prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0);
  prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0);
}

// Whether a process started like the CLI is refused `path` (mode 000).
bool permissions_enforced(const std::string& path) {
  const pid_t pid = fork();
  if (pid == 0) {
    drop_dac_capabilities();
    if (geteuid() == 0) {  // root: the bounding set applies at exec; drop the effective caps now too
      __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
      __user_cap_data_struct d[2] = {};
      if (syscall(SYS_capget, &h, d) == 0) {
        d[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
        syscall(SYS_capset, &h, d);
      }
    }
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY);
    _exit(fd < 0 && errno == EACCES ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST_F(CliTest, UnreadablePathsAreOneLineErrorsExitOne) {
  synth_save(1, "256KiB", 5);
  const std::string locked = dir_ + "/locked";
  fs::create_directories(locked + "/ckpt");
  ASSERT_EQ(chmod(locked.c_str(), 0), 0);
  struct Restore {
    std::string p;
    ~Restore() { chmod(p.c_str(), 0755); }
  } restore{locked};
  if (!permissions_enforced(locked))
    GTEST_SKIP() << "SKIPPED LOUDLY: mode 000 does not stop this process (uid " << geteuid()
                 << ") even after dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so unreadable "
                    "paths cannot be made here";
  auto run_denied = [&](const std::vector<std::string>& args) {
    CliResult r = run_cli(args, drop_dac_capabilities);
    EXPECT_EQ(r.code, 1) << show(args, r);
    expect_one_error_line(r);
    EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << show(args, r);
    return r;
  };
  // The checkpoint directory itself, and a path below it.
  for (const std::string cmd : {"ls", "verify", "inspect", "gc"}) {
    std::vector<std::string> args = {cmd, locked};
    if (cmd == "gc") args = {"gc", locked, "--keep-last", "1"};
    CliResult r = run_denied(args);
    EXPECT_NE(r.err.find(locked), std::string::npos) << r.err;
    args[1] = locked + "/ckpt";
    run_denied(args);
  }
  run_denied({"synth", "check", locked});

  // An unreadable data file: named, never skipped as damage.
  const std::string data = step_dir(1) + "/" + data_file_of(step_dir(1));
  ASSERT_EQ(chmod(data.c_str(), 0), 0);
  CliResult v = run_denied({"verify", dir_});
  EXPECT_NE(v.err.find(data), std::string::npos) << v.err;
  CliResult c = run_denied({"synth", "check", dir_});
  EXPECT_NE(c.err.find(data), std::string::npos) << c.err;
  EXPECT_EQ(c.out.find("skipped"), std::string::npos) << c.out;
  ASSERT_EQ(chmod(data.c_str(), 0644), 0);

  // An unreadable index: the same.
  const std::string index = step_dir(1) + "/" + ckptio::kIndexFileName;
  ASSERT_EQ(chmod(index.c_str(), 0), 0);
  CliResult i = run_denied({"inspect", dir_});
  EXPECT_NE(i.err.find(index), std::string::npos) << i.err;
  run_denied({"synth", "check", dir_});
  ASSERT_EQ(chmod(index.c_str(), 0644), 0);
  run({"synth", "check", dir_});
}

TEST_F(CliTest, GcKeepsTheLastStepAndRemovesDeadAttempts) {
  for (int s = 1; s <= 3; ++s) synth_save(s, "512KiB", 6);
  fs::create_directories(dir_ + "/run-9.tmp-00000000deaddead");
  std::ofstream(dir_ + "/run-9.tmp-00000000deaddead/data-dead-0.bin") << "leftover";
  // Not ckptio's: its suffix is no attempt id (16 hex digits), and a step
  // name with a '-' before its digits is no step (it was step 0 of a
  // "run{step}" base: -0). Neither is listed or removed.
  fs::create_directories(dir_ + "/run-9.tmp-notes");
  std::ofstream(dir_ + "/run-9.tmp-notes/todo.txt") << "mine";
  fs::create_directories(dir_ + "/run--0");

  json before = run_json({"ls", dir_, "--json"});
  EXPECT_EQ(before.size(), 4u) << before.dump();
  bool saw_tmp = false;
  for (const json& e : before) {
    if (e["name"] != "run-9.tmp-00000000deaddead") continue;
    saw_tmp = true;
    EXPECT_EQ(e["committed"], false);
    EXPECT_EQ(e["state"], "temporary");
  }
  EXPECT_TRUE(saw_tmp);

  // Just written: it may be a save in progress elsewhere, and the default
  // --min-age (an hour) keeps it; retention still runs.
  CliResult young = run({"gc", dir_, "--keep-last", "2"});
  EXPECT_EQ(young.out.find("run-9.tmp-00000000deaddead"), std::string::npos) << young.out;
  EXPECT_NE(young.out.find("run-1"), std::string::npos) << young.out;
  EXPECT_TRUE(fs::exists(dir_ + "/run-9.tmp-00000000deaddead/data-dead-0.bin"));
  // Two hours old (the file and the directory): a leftover.
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(dir_ + "/run-9.tmp-00000000deaddead/data-dead-0.bin", old_time);
  fs::last_write_time(dir_ + "/run-9.tmp-00000000deaddead", old_time);
  fs::last_write_time(dir_ + "/run-9.tmp-notes/todo.txt", old_time);
  fs::last_write_time(dir_ + "/run-9.tmp-notes", old_time);
  CliResult gc = run({"gc", dir_, "--keep-last", "1"});
  EXPECT_NE(gc.out.find("run-9.tmp-00000000deaddead"), std::string::npos) << gc.out;
  EXPECT_NE(gc.out.find("run-2"), std::string::npos) << gc.out;
  EXPECT_FALSE(fs::exists(dir_ + "/run-9.tmp-00000000deaddead"));
  EXPECT_TRUE(fs::exists(dir_ + "/run-9.tmp-notes/todo.txt")) << "gc removed a directory that is not ckptio's";
  EXPECT_TRUE(fs::exists(dir_ + "/run--0"));

  json after = run_json({"ls", dir_, "--json"});
  ASSERT_EQ(after.size(), 1u) << after.dump();
  EXPECT_EQ(after[0]["step"], 3);
  EXPECT_EQ(after[0]["committed"], true);
  run({"synth", "check", dir_});

  json again = run_json({"gc", dir_, "--keep-last", "1", "--json"});
  EXPECT_TRUE(again["removed"].empty());
}

TEST_F(CliTest, BenchReportsItsFiguresAndCleansUp) {
  json b = run_json({"bench", "--uri", dir_, "--bytes", "8MiB", "--leaves", "20", "--repeat", "2",
                     "--json"});
  // Every key bench/run-all reads (a rename of the C++ variables once renamed
  // three of them, and the full run lost its local section).
  for (const char* key : {"save_gbps", "restore_gbps", "restore_fresh_gbps", "stall_ms", "memcpy_ms",
                          "stall_vs_memcpy", "first_touch_gbps", "peak_rss_bytes", "rss_limit_bytes",
                          "verified", "bytes", "cold_cache", "runs"})
    EXPECT_TRUE(b.contains(key)) << key << " missing in " << b.dump();
  EXPECT_EQ(b["verified"], true);
  EXPECT_GT(b["bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(b["save_gbps"].get<double>(), 0);
  EXPECT_GT(b["restore_gbps"].get<double>(), 0);
  EXPECT_GT(b["peak_rss_bytes"].get<uint64_t>(), 0u);
  ASSERT_EQ(b["runs"].size(), 2u);
  EXPECT_NE(b["runs"][0]["step"], b["runs"][1]["step"]);
  // Each run says when its restore began on CLOCK_MONOTONIC (bench/run-all
  // profiles the server's CPU over that window): before now, after the first.
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const double first = b["runs"][0]["restore_started_monotonic_s"].get<double>();
  const double second = b["runs"][1]["restore_started_monotonic_s"].get<double>();
  EXPECT_GT(first, 0);
  EXPECT_GT(second, first);
  EXPECT_LT(second, static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9);
  json ls = run_json({"ls", dir_, "--json"});
  EXPECT_TRUE(ls.empty()) << "bench left steps behind: " << ls.dump();

  json mem = run_json({"bench", "--uri", "mem://bench", "--bytes", "2MiB", "--json"});
  EXPECT_EQ(mem["verified"], true);
  EXPECT_EQ(mem["cold_cache"], false);
  EXPECT_TRUE(mem.contains("cold_cache_note")) << mem.dump();
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  CliResult unknown = run({"frobnicate"}, 2);
  expect_one_error_line(unknown);
  EXPECT_NE(unknown.err.find("unknown subcommand 'frobnicate'"), std::string::npos) << unknown.err;
  run({}, 2);
  expect_one_error_line(run({"synth", "save", dir_, "--step", "1", "--bytes", "12XB"}, 2));
  expect_one_error_line(run({"synth", "save", dir_, "--step", "1", "--bytes", "-5"}, 2));
  expect_one_error_line(run({"synth", "save", dir_, "--bytes", "1MiB"}, 2));  // no --step
  expect_one_error_line(run({"synth", "save", dir_, "--step", "-1", "--bytes", "1MiB"}, 2));
  for (const char* cmd : {"inspect", "verify"})  // (before: exit 3, "not found")
    expect_one_error_line(run({cmd, dir_, "--step", "-1"}, 2));
  expect_one_error_line(run({"synth", "check", dir_, "--step", "-1"}, 2));
  expect_one_error_line(run({"synth", "save", dir_, "--step", "1", "--bytes", "1MiB",
                             "--leaves", "0"}, 2));
  expect_one_error_line(run({"synth"}, 2));
  expect_one_error_line(run({"synth", "save", dir_, "--step", "1", "--bytes", "1MiB",
                             "--staging", "sideways"}, 2));
  expect_one_error_line(run({"bench", "--uri", dir_, "--bytes", "lots"}, 2));
  expect_one_error_line(run({"ls", "gs://bucket/prefix"}, 2));
  expect_one_error_line(run({"ls", "file://relative/path"}, 2));
  expect_one_error_line(run({"--log-level", "loud", "ls", dir_}, 2));
  expect_one_error_line(run({"verify", dir_, "--step", "1", "--all"}, 2));
  expect_one_error_line(run({"--chunk-size", "1.5.5", "synth", "save", dir_, "--step", "1",
                             "--bytes", "1MiB"}, 2));
  // --keep-every without --keep-last was silently ignored (no retention runs),
  // and so was it with --keep-last 0 (which deletes no step).
  expect_one_error_line(run({"gc", dir_, "--keep-every", "2"}, 2));
  expect_one_error_line(run({"gc", dir_, "--keep-last", "0", "--keep-every", "2"}, 2));
  // A size of 0 was the library's default in disguise (--chunk-size 0 wrote 8 MiB requests).
  for (const char* opt : {"--chunk-size", "--request-size", "--s3-part-size", "--staging-budget"})
    expect_one_error_line(run({opt, "0", "synth", "save", dir_, "--step", "1", "--bytes", "1MiB"}, 2));
  expect_one_error_line(run({"synth", "check", dir_, "--batch", "0"}, 2));
  // --batch bounds a whole restore's memory; a sharded check ignored it.
  expect_one_error_line(run({"synth", "check", dir_, "--mesh", "dp=2", "--batch", "1MiB"}, 2));
  // Forked processes share no mem:// store: the save could only time out.
  expect_one_error_line(run({"synth", "save", "mem://x", "--step", "1", "--bytes", "64KiB", "--leaves", "3",
                             "--processes", "2", "--barrier-timeout", "1"},
                            2));
  EXPECT_TRUE(fs::is_empty(dir_));
}

// Integers are decimal and within their type: CLI11 read them in base 0
// ("010" was 8, "0x10" 16) and let a 64-bit one saturate ("--step
// 99999999999999999999" saved step 9223372036854775807) or an unsigned one
// wrap ("--seed -1"); a floating-point option took "nan" and failed later,
// exit 1.
TEST_F(CliTest, NumbersAreDecimalAndInRange) {
  run({"synth", "save", dir_, "--step", "010", "--bytes", "64KiB", "--leaves", "3"});
  json ls = run_json({"ls", dir_, "--json"});
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0]["step"], 10) << ls.dump();
  expect_one_error_line(run({"synth", "save", dir_, "--step", "99999999999999999999", "--bytes", "64KiB"}, 2));
  expect_one_error_line(run({"synth", "save", dir_, "--step", "0x10", "--bytes", "64KiB"}, 2));
  expect_one_error_line(run({"synth", "save", dir_, "--step", "2", "--bytes", "64KiB", "--seed", "-1"}, 2));
  expect_one_error_line(run({"inspect", dir_, "--step", "9223372036854775808"}, 2));
  expect_one_error_line(run({"gc", dir_, "--min-age", "nan"}, 2));
  EXPECT_EQ(run_json({"inspect", dir_, "--step", "0010", "--json"})["step"], 10);
  EXPECT_EQ(run_json({"ls", dir_, "--json"}).size(), 1u);
}

TEST_F(CliTest, MissingThingsExitThree) {
  expect_one_error_line(run({"inspect", dir_}, 3));       // no committed step
  expect_one_error_line(run({"synth", "check", dir_}, 3));
  expect_one_error_line(run({"verify", dir_, "--all"}, 3));
  synth_save(1, "256KiB", 5);
  expect_one_error_line(run({"inspect", dir_, "--step", "99"}, 3));
  expect_one_error_line(run({"verify", dir_, "--step", "99"}, 3));
  expect_one_error_line(run({"synth", "check", dir_, "--step", "2"}, 3));
  const std::string nowhere = dir_ + "/does/not/exist";
  expect_one_error_line(run({"ls", nowhere}, 3));
  expect_one_error_line(run({"verify", nowhere}, 3));
  EXPECT_FALSE(fs::exists(nowhere)) << "a reading command created its URI";
  json ls = run_json({"ls", "file://" + dir_, "--json"});
  EXPECT_EQ(ls.size(), 1u);
}

TEST_F(CliTest, HelpDocumentsExitCodes) {
  CliResult r = run({"--help"});
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << r.out;
  for (const char* sub : {"ls", "inspect", "verify", "gc", "synth", "demo", "bench"})
    EXPECT_NE(r.out.find(sub), std::string::npos) << sub;
  run({"synth", "save", "--help"});
}

// docs/cli.md is the CLI's reference: every option some command's --help
// lists is named there (as a whole word: `--keep` is not `--keep-last`).
TEST_F(CliTest, EveryOptionInHelpIsInTheReference) {
  std::ifstream in(std::string(CKPTIO_SOURCE_DIR) + "/docs/cli.md");
  ASSERT_TRUE(in) << "docs/cli.md";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; };
  auto in_doc = [&](const std::string& opt) {
    for (size_t at = doc.find(opt); at != std::string::npos; at = doc.find(opt, at + 1))
      if (at + opt.size() == doc.size() || !word(doc[at + opt.size()])) return true;
    return false;
  };
  size_t seen = 0;
  for (std::vector<std::string> cmd : std::vector<std::vector<std::string>>{
           {}, {"ls"}, {"inspect"}, {"verify"}, {"gc"}, {"cp"}, {"synth", "save"}, {"synth", "check"},
           {"demo"}, {"bench"}}) {
    cmd.push_back("--help");
    CliResult r = run(cmd);
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      // Option lines of CLI11's help: "  -h,--help ..." or "  --bytes TEXT ...";
      // the names run to the first space.
      const size_t first = line.find_first_not_of(' ');
      if (first == std::string::npos || first < 2 || line[first] != '-') continue;
      const size_t names_end = line.find(' ', first);
      for (size_t at = line.find("--", first); at < names_end; at = line.find("--", at + 2)) {
        size_t end = at + 2;
        while (end < line.size() && word(line[end])) ++end;
        const std::string opt = line.substr(at, end - at);
        if (opt == "--help" || opt == "--help-all") continue;
        ++seen;
        EXPECT_TRUE(in_doc(opt)) << show(cmd, r) << ": " << opt << " is not in docs/cli.md";
      }
    }
  }
  EXPECT_GT(seen, 60u) << "the help output was not parsed";
}

TEST_F(CliTest, DemoRunsAndRestartsBitExact) {
  CliResult r = run({"demo", dir_, "--steps", "6", "--bytes", "64MiB", "--train-ms", "20"});
  EXPECT_NE(r.out.find("step 3 committed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 6 committed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bit-exact"), std::string::npos) << r.out;
  json ls = run_json({"ls", dir_, "--json"});
  ASSERT_EQ(ls.size(), 2u) << ls.dump();  // max_to_keep = 2
  EXPECT_EQ(ls[0]["step"], 3);
  EXPECT_EQ(ls[1]["step"], 6);
  run({"synth", "check", dir_});  // the demo's metadata describes its updates
}

// The CLI links no S3 code (docs/architecture.md, "Backends loaded on
// demand"): it starts without libcurl's libraries and loads the module
// ckptio_s3_backend.so from beside itself on the first s3:// URI, or says
// clearly why it cannot.
TEST_F(CliTest, TheS3BackendIsAModuleLoadedOnTheFirstS3Uri) {
  struct Env {  // set for the children this test starts
    std::string name;
    Env(const char* n, const std::string& v) : name(n) { setenv(n, v.c_str(), 1); }
    ~Env() { unsetenv(name.c_str()); }
  };
  {
    Env trace("LD_TRACE_LOADED_OBJECTS", "1");  // the dynamic loader lists what it loads, and exits
    CliResult r = run_cli({});
    ASSERT_NE(r.out.find("libc.so"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("libcurl"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("ckptio_s3_backend"), std::string::npos) << r.out;
  }
  // Loaded: the backend itself refuses a bucket name too short (usage error).
  CliResult bad = run({"ls", "s3://ab/x"}, 2);
  EXPECT_NE(bad.err.find("bucket names have 3 to 63 characters"), std::string::npos) << bad.err;
  // Not found where CKPTIO_BACKEND_PATH says: the module and the place are named.
  const std::string empty = dir_ + "/no-modules";
  fs::create_directories(empty);
  {
    Env path("CKPTIO_BACKEND_PATH", empty);
    CliResult r = run({"ls", "s3://abc/x"}, 1);
    expect_one_error_line(r);
    EXPECT_NE(r.err.find("ckptio_s3_backend.so, which is not in " + empty), std::string::npos) << r.err;
  }
  // A file of that name that is not a module: the loader's reason, no crash.
  {
    std::ofstream(empty + "/ckptio_s3_backend.so") << "not an ELF file\n";
    Env path("CKPTIO_BACKEND_PATH", "/nonexistent:" + empty);
    CliResult r = run({"ls", "s3://abc/x"}, 1);
    expect_one_error_line(r);
    EXPECT_NE(r.err.find("s3:// URIs need the backend module ckptio_s3_backend.so: " + empty), std::string::npos)
        << r.err;
  }
}

}  // namespace
