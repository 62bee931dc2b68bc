// A child process for tests that run the real executables (`anvil serve`, anvil-bench): its
// stdout and stderr read through a pipe with bounded waits, signals, and a bounded wait for its
// exit. Killed (SIGKILL) if still running when the test lets go of it.
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace anvil::testing {

// A child process with its stdout (and stderr) read through a pipe.
class child {
 public:
  // `env`: extra NAME=VALUE entries on top of this process's environment.
  explicit child(std::vector<std::string> args, std::vector<std::string> env = {}) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) throw std::runtime_error("spawn");
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    fd_ = out[0];
  }
  ~child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  // Reads output until `re` matches a line (returned), or end of output / timeout ("").
  std::smatch wait_for(const std::regex& re, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (std::size_t nl; (nl = buf_.find('\n')) != std::string::npos;) {
        line_ = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        all_ += line_ + "\n";
        std::smatch m;
        if (std::regex_search(line_, m, re)) return m;
      }
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) return {};
      char tmp[4096];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) return {};
      buf_.append(tmp, std::size_t(n));
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  // The exit status, or -1 if it did not exit within `timeout`.
  int wait_exit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  const std::string& output() const { return all_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_, line_, all_;
};

}  // namespace anvil::testing
