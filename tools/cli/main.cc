// `ckptio`: the command-line tool. Global options and dispatch; each
// subcommand lives in its own file (ls.cc, inspect.cc, ...).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <new>

#include "tools/cli/cli.h"

namespace {

constexpr const char* kFooter = R"(
URIs:   /path or file:///path (local disk, io_uring); s3://BUCKET[/PREFIX]
        (an S3-compatible object store); mem://NAME (in-process store: empty
        in every new process, useful for demo and bench only).
S3:     settings not given as --s3-* options follow the AWS conventions:
        AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION,
        AWS_PROFILE with ~/.aws/config and ~/.aws/credentials. Credentials,
        in botocore's order: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
        AWS_SESSION_TOKEN; the profile's role_arn (STS AssumeRole); web
        identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, EKS); the
        profile's keys; its credential_process; the container endpoint
        (AWS_CONTAINER_CREDENTIALS_*, ECS / EKS Pod Identity); EC2 instance
        metadata. Temporary ones are renewed in the background (docs/s3.md).
        ckptio never takes a secret on its command line, where other users
        could read it (ps, /proc, shell history). With no credentials
        anywhere, requests go unsigned (public buckets, local test servers).
SIZE:   bytes, or a number with a suffix: K/KiB, M/MiB, G/GiB, T/TiB are powers
        of 1024; KB, MB, GB, TB are powers of 1000; case-insensitive; a fraction
        is allowed ("1.5GiB").
Exit codes:
        0  success
        1  the operation failed (verify or synth check found damage, a save
           failed, an I/O error, a permission denied)
        2  usage error (bad option, subcommand, URI or SIZE)
        3  not found (no such step, no committed step, no such directory)
Errors are one line on stderr: "ckptio: <message>". Progress lines appear on
stderr only when it is a terminal.)";

void setup_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("ckptio_cli");
  logger->set_pattern("[%l] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level == "warn" ? "warning" : level));
}

}  // namespace

// The command line's wiring, ~120 lines: global options, one add_* per
// command, and the mapping of outcomes to exit codes, in the order --help
// shows them.
int main(int argc, char** argv) {
  using namespace ckptio::cli;
  GlobalOptions g;
  CLI::App app{"ckptio: asynchronous, atomic checkpoints of training state", "ckptio"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  app.set_help_all_flag("--help-all", "Print help for every subcommand and exit");

  app.add_option("--log-level", g.log_level, "Library log level (default warn)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_option("--step-format", g.step_format,
                 "Step directory name; {step} is the step number (default run-{step})");
  app.add_flag("--strict", g.strict,
               "Treat a damaged step as an error: `synth check` without --step fails on the newest "
               "damaged step instead of skipping it (ManagerOptions::strict)");
  auto* local = "Local backend";
  app.add_option("--direct-io", g.direct_io, "O_DIRECT: auto (fall back when refused), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->group(local);
  app.add_option("--read-mode", g.read_mode, "Reads: direct (io_uring O_DIRECT) or buffered")
      ->check(CLI::IsMember({"direct", "buffered"}))
      ->group(local);
  app.add_option("--request-size", g.request_size, "SIZE of one ring request (default: measured)")
      ->group(local);
  app.add_option("--queue-depth", g.queue_depth, "Ring entries in flight (default: measured)")
      ->group(local);
  app.add_option("--chunk-size", g.chunk_size, "SIZE of one write request (default 8MiB)")
      ->group("Saving");
  app.add_option("--staging-budget", g.staging_budget,
                 "SIZE bound on staging memory per manager (default 1GiB)")
      ->group("Saving");

  auto* s3 = "S3 backend (s3:// URIs; credentials never as options, see below)";
  app.add_option("--s3-endpoint", g.s3_endpoint,
                 "http(s)://host[:port] of an S3-compatible server (default: AWS for the region)")
      ->group(s3);
  app.add_option("--s3-region", g.s3_region, "Region for signing (default us-east-1)")->group(s3);
  app.add_option("--s3-profile", g.s3_profile,
                 "Profile in ~/.aws/config and ~/.aws/credentials (as AWS_PROFILE)")
      ->group(s3);
  app.add_option("--s3-part-size", g.s3_part_size,
                 "SIZE of a multipart part, in [5MiB, 5GiB], a multiple of 4096 (default 16MiB); the unit of every write")
      ->group(s3);
  app.add_option("--s3-max-connections", g.s3_max_connections, "Requests in flight (default 32)")
      ->check(positive())
      ->group(s3);
  app.add_option("--s3-addressing", g.s3_addressing,
                 "path (http://host/bucket/key) or virtual (http://bucket.host/key); default: path "
                 "for a custom endpoint, virtual for AWS")
      ->check(CLI::IsMember({"path", "virtual"}))
      ->group(s3);
  app.add_flag("--s3-anonymous", g.s3_anonymous, "Send unsigned requests (public buckets)")
      ->group(s3);
  app.add_option("--s3-max-attempts", g.s3_max_attempts,
                 "Tries per request, the first included (default 10)")
      ->check(positive())
      ->group(s3);
  app.add_option("--s3-timeout", g.s3_timeout_s,
                 "SECONDS a transfer may stall before it fails (default 60)")
      ->check(positive())
      ->group(s3);
  app.add_option("--s3-checksums", g.s3_checksums,
                 "on: send x-amz-checksum-crc32c with every upload, so the server refuses a body "
                 "damaged on the way; off: for a server that refuses the header (default: on, or "
                 "AWS_REQUEST_CHECKSUM_CALCULATION)")
      ->check(CLI::IsMember({"on", "off"}))
      ->group(s3);
  app.add_option("--s3-sse", g.s3_sse,
                 "Server-side encryption of every object written: AES256, aws:kms or aws:kms:dsse "
                 "(default: the bucket's)")
      ->check(CLI::IsMember({"AES256", "aws:kms", "aws:kms:dsse"}))
      ->group(s3);
  app.add_option("--s3-sse-kms-key-id", g.s3_sse_kms_key_id,
                 "KMS key (id, ARN or alias) for --s3-sse aws:kms (default: the account's)")
      ->group(s3);
  app.add_option("--s3-storage-class", g.s3_storage_class,
                 "Storage class of every object written, e.g. INTELLIGENT_TIERING (default: the bucket's)")
      ->group(s3);

  Command run;
  add_ls(app, g, &run);
  add_inspect(app, g, &run);
  add_verify(app, g, &run);
  add_gc(app, g, &run);
  add_cp(app, g, &run);
  add_synth(app, g, &run);
  add_demo(app, g, &run);
  add_bench(app, g, &run);
  strict_numbers(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all
    // CLI11 reports "A subcommand is required" for "ckptio frobnicate".
    const std::vector<std::string> extra = app.remaining();
    CLI::App* cmd = &app;
    while (!cmd->get_subcommands().empty()) cmd = cmd->get_subcommands().front();
    if (!extra.empty() && cmd->get_require_subcommand_min() > 0)
      std::fprintf(stderr, "ckptio: unknown subcommand '%s%s' (see ckptio %s--help)\n",
                   cmd == &app ? "" : (cmd->get_name() + " ").c_str(), extra[0].c_str(),
                   cmd == &app ? "" : (cmd->get_name() + " ").c_str());
    else
      std::fprintf(stderr, "ckptio: %s (see ckptio --help)\n", e.what());
    return kExitUsage;
  }

  try {
    setup_logging(g.log_level);
    if (!run) {  // a command group ("synth") without its subcommand
      std::fprintf(stderr, "ckptio: missing subcommand (see ckptio --help)\n");
      return kExitUsage;
    }
    return run();
  } catch (const CliError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "ckptio: %s\n", terminal_text(e.what()).c_str());
    return e.code();
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "ckptio: out of memory\n");
    return kExitFailed;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "ckptio: %s\n", terminal_text(e.what()).c_str());
    return kExitFailed;
  }
}
