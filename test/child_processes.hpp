// Tests that need processes of their own (several processes on one controller, a process killed
// mid-I/O): this program run again, and a bounded wait for it. Plain C++ and POSIX, for the
// doctest programs and the static guest programs alike.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace test {

/// Starts this program (/proc/self/exe) again with `args` (argv[1]…) and this process's
/// environment, each variable named in `env` ("NAME=value") replacing its namesake. Returns the
/// child's pid, or -1 where posix_spawn fails.
inline pid_t spawn_self(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv_text = {"/proc/self/exe"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<std::string> env_text = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::size_t name = eq == nullptr ? std::strlen(*e) : static_cast<std::size_t>(eq - *e);
    bool replaced = false;
    for (const std::string& given : env) replaced = replaced || given.compare(0, name + 1, std::string(*e, name) + "=") == 0;
    if (!replaced) env_text.emplace_back(*e);
  }
  std::vector<char*> argv, envp;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  return ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) == 0 ? pid : -1;
}

/// Waits at most `limit` for `pid` and returns its wait status; -1 when it ran past the limit
/// (it is then killed and reaped, so no test hangs on a child).
inline int wait_bounded(pid_t pid, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  (void)::waitpid(pid, &status, 0);
  return -1;
}

}  // namespace test
