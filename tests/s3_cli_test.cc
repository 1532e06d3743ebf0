// The `ckptio` command line over s3:// URIs against the loopback S3 servers:
// the same commands as on local disk, configured the way users configure the
// AWS tools (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), plus `cp` between a
// bucket and a local directory.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "testutil/cli_runner.h"
#include "testutil/s3_server.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testutil::CliResult;
using testutil::run_cli;
using testutil::show;

class S3Cli : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    CKPTIO_REQUIRE_S3_SERVER(srv);
    setenv("AWS_ENDPOINT_URL", srv.endpoint.c_str(), 1);
    setenv("AWS_ACCESS_KEY_ID", srv.access_key.c_str(), 1);
    setenv("AWS_SECRET_ACCESS_KEY", srv.secret_key.c_str(), 1);
    setenv("AWS_REGION", srv.region.c_str(), 1);
    unsetenv("AWS_PROFILE");
    std::string prefix = testutil::s3_test_prefix();
    prefix.pop_back();
    uri_ = "s3://" + srv.bucket + "/" + prefix;
    std::string tmpl = "/tmp/ckptio-s3cli.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  CliResult run(const std::vector<std::string>& args, int code) {
    CliResult r = run_cli(args);
    EXPECT_EQ(r.code, code) << show(args, r);
    return r;
  }
  std::string uri_, dir_;
};

TEST_P(S3Cli, SynthSaveCheckListInspectVerifyGc) {
  // 12 MiB with 5 MiB parts: multipart data files, parallel ranged reads.
  const std::vector<std::string> s3opt = {"--s3-part-size", "5MiB"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.begin(), s3opt.begin(), s3opt.end());
    return a;
  };
  run(with({"synth", "save", uri_, "--step", "10", "--bytes", "12MiB", "--leaves", "8", "--seed", "3"}), 0);
  run(with({"synth", "save", uri_, "--step", "20", "--bytes", "1MiB", "--leaves", "4", "--seed", "4"}), 0);
  run(with({"synth", "check", uri_}), 0);
  run(with({"synth", "check", uri_, "--step", "10"}), 0);

  CliResult ls = run({"ls", uri_, "--json"}, 0);
  json steps = json::parse(ls.out);
  ASSERT_EQ(steps.size(), 2u) << ls.out;
  EXPECT_EQ(steps[0]["step"], 10);
  EXPECT_EQ(steps[0]["committed"], true);
  EXPECT_GT(steps[0]["bytes"].get<uint64_t>(), 11u << 20);

  CliResult inspect = run({"inspect", uri_, "--json"}, 0);
  json idx = json::parse(inspect.out);
  EXPECT_EQ(idx["step"], 20);
  EXPECT_FALSE(idx["leaves"].empty());

  run({"verify", uri_, "--step", "10"}, 0);
  run({"gc", uri_, "--keep-last", "1"}, 0);
  ls = run({"ls", uri_, "--json"}, 0);
  steps = json::parse(ls.out);
  ASSERT_EQ(steps.size(), 1u) << ls.out;
  EXPECT_EQ(steps[0]["step"], 20);
  run({"verify", uri_, "--step", "10"}, 3);  // gone: not found
}

// On a terminal, `synth save` draws a progress line from the save's own
// counters (SaveHandle::progress), on object stores too: the line used to
// sum the sizes under "<step>.tmp-" prefixes, which object stores never
// have, and showed "0 B / ..." until the step committed. Runs the CLI
// under script(1) for a pseudo-terminal, with a state large enough for
// several redraws (every 200 ms), and wants a redraw of the save's line that
// counts more than 0 bytes.
TEST_P(S3Cli, SaveProgressLineCountsBytesOnATerminal) {
  const std::string cmd = std::string("script -qec '") + CKPTIO_CLI_PATH + " synth save " + uri_ +
                          " --step 1 --bytes 96MiB --leaves 8 --seed 5' /dev/null < /dev/null 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int rc = pclose(f);
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  int lines = 0, counted = 0;
  for (size_t at = out.find("saving step 1: "); at != std::string::npos;
       at = out.find("saving step 1: ", at + 1)) {
    ++lines;
    if (out.compare(at + 15, 4, "0 B ") != 0) ++counted;
  }
  ASSERT_GT(lines, 0) << "no progress line while saving (the save took under 200 ms?):\n" << out;
  EXPECT_GT(counted, 0) << "every progress line showed 0 bytes:\n" << out;
}

TEST_P(S3Cli, CopyBetweenBucketAndDisk) {
  run({"--s3-part-size", "5MiB", "synth", "save", uri_, "--step", "7", "--bytes", "11MiB", "--seed", "9"}, 0);
  const std::string local = dir_ + "/ckpt";
  run({"cp", uri_, local}, 0);
  run({"synth", "check", local, "--step", "7"}, 0);
  const std::string back = uri_ + "-copy";
  run({"--s3-part-size", "5MiB", "cp", local, back, "--step", "7"}, 0);
  run({"synth", "check", back, "--step", "7"}, 0);
  run({"verify", back, "--step", "7"}, 0);
  run({"cp", uri_, back, "--step", "7"}, 1);  // already there: refused
}

TEST_P(S3Cli, MissingStepsAndBadUrisAreClearErrors) {
  CliResult r = run({"verify", uri_, "--step", "5"}, 3);
  EXPECT_NE(r.err.find("5"), std::string::npos) << r.err;
  r = run({"ls", "s3://"}, 2);
  EXPECT_NE(r.err.find("s3://"), std::string::npos) << r.err;
  r = run({"ls", "s3://bad..bucket/x"}, 2);
}

INSTANTIATE_TEST_SUITE_P(S3Moto, S3Cli, ::testing::Values("Moto"));
INSTANTIATE_TEST_SUITE_P(S3S3rver, S3Cli, ::testing::Values("S3rver"));
INSTANTIATE_TEST_SUITE_P(S3Ceph, S3Cli, ::testing::Values("Ceph"));

}  // namespace
}  // namespace ckptio
