// Runs the `ckptio` binary (CKPTIO_CLI_PATH) as a child process and captures
// its exit code, stdout and stderr. The child inherits the environment.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

namespace ckptio::testutil {

struct CliResult {
  int code = -1;  // exit status; 128 + signal when killed
  std::string out;
  std::string err;
};

inline std::string show(const std::vector<std::string>& args, const CliResult& r) {
  std::string s = "ckptio";
  for (const auto& a : args) s += " " + a;
  return s + "\n  exit " + std::to_string(r.code) + "\n  stdout: " + r.out.substr(0, 4000) +
         "\n  stderr: " + r.err.substr(0, 4000);
}

// `in_child` runs in the forked child just before exec (e.g. to drop
// capabilities); it must only make async-signal-safe calls.
inline CliResult run_cli(const std::vector<std::string>& args, void (*in_child)() = nullptr) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return {};
  std::vector<std::string> storage = {CKPTIO_CLI_PATH};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (in_child) in_child();
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  CliResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace ckptio::testutil
