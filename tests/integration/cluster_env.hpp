// Multi-process test helpers: a child process with its output in a log file, and a job run by
// hand (`desloc coordinator` plus `desloc worker` processes), for fault injection.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_env.hpp"

namespace desloc::test {

// A child process with its output in a file.
struct Process {
  pid_t pid = -1;
  fs::path log;
  int status = -1;

  static Process start(const std::vector<std::string>& args, const fs::path& log,
                       const std::vector<std::pair<std::string, std::string>>& env = {}) {
    Process p;
    p.log = log;
    p.pid = ::fork();
    if (p.pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return p;
  }
  // Exit status, or -1 if still running at the deadline (then it is killed).
  int wait(std::chrono::milliseconds limit) {
    using Clock = std::chrono::steady_clock;
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  std::string output() const {
    std::ifstream in(log);
    return {std::istreambuf_iterator<char>(in), {}};
  }
};

// A desloc job of `sites` (TOML list items) x `ranks`, 20 steps, DES-LOC with Kx = 2.
inline std::string multi_site_toml(const fs::path& out, const std::string& sites, int ranks) {
  return tiny_job_toml(out) + "[sync]\nmethod = \"desloc\"\nkx = 2\n[job]\nsites = [" + sites +
         "]\nranks_per_site = " + std::to_string(ranks) +
         "\nrendezvous_timeout_s = 20\n[transport]\ndeadline_s = 20\n";
}

inline std::string with_steps(std::string toml, int steps) {
  const auto at = toml.find("steps = 20");
  toml.replace(at, 10, "steps = " + std::to_string(steps));
  return toml;
}

// A field of every train and eval record of a metrics file, as its JSON text.
inline std::vector<std::string> train_field(const fs::path& metrics, const std::string& field) {
  std::ifstream in(metrics);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"type\":\"train\"") == std::string::npos &&
        line.find("\"type\":\"eval\"") == std::string::npos)
      continue;
    const auto at = line.find("\"" + field + "\":");
    if (at == std::string::npos) continue;
    const auto start = at + field.size() + 3;
    auto end = line.find_first_of(line[start] == '[' ? "]" : ",}", start);
    out.push_back(line.substr(start, end - start + (line[start] == '[' ? 1 : 0)));
  }
  return out;
}

// A /proc file of NUL-separated strings (cmdline, environ), one entry each.
inline std::vector<std::string> proc_strings(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string a; std::getline(in, a, '\0');) out.push_back(a);
  return out;
}

// The first process for which `match(pid, its /proc directory)` holds; -1 if none.
template <class Match>
pid_t find_process(Match match) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (match(pid, entry.path())) return pid;
  }
  return -1;
}

// The child of `parent` whose command line holds `arg` as one argument; -1 if none.
inline pid_t child_with_argument(pid_t parent, const std::string& arg) {
  return find_process([&](pid_t, const fs::path& proc) {
    std::ifstream stat(proc / "stat");
    const std::string text((std::istreambuf_iterator<char>(stat)), {});
    const auto close = text.rfind(')');
    char state = 0;
    int ppid = 0;
    if (close == std::string::npos ||
        std::sscanf(text.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != parent)
      return false;
    const auto args = proc_strings(proc / "cmdline");
    return std::find(args.begin(), args.end(), arg) != args.end();
  });
}

// A job run by hand: the coordinator on an ephemeral port, and workers started one by one.
struct Cluster {
  fs::path dir;
  Process coordinator;
  int port = 0;

  // Starts `desloc coordinator` on an ephemeral port and reads the port from its first line.
  void start(const fs::path& cfg, int listen_port = 0) {
    using Clock = std::chrono::steady_clock;
    std::error_code ignored;
    fs::remove(dir / "coordinator.log", ignored);  // a restart must not read the old port
    coordinator = Process::start({DESLOC_CLI, "coordinator", "--config", cfg.string(), "--listen",
                                  "127.0.0.1:" + std::to_string(listen_port)},
                                 dir / "coordinator.log");
    const auto end = Clock::now() + std::chrono::seconds(10);
    port = 0;
    while (Clock::now() < end && port == 0) {
      const std::string out = coordinator.output();
      const auto at = out.find("listening on 127.0.0.1:");
      if (at != std::string::npos) port = std::atoi(out.c_str() + at + 23);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_NE(port, 0) << coordinator.output();
  }
  Process worker(const fs::path& cfg, const std::string& site, int rank,
                 const std::vector<std::pair<std::string, std::string>>& env = {},
                 const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> args{DESLOC_CLI,      "worker",
                                  "--config",      cfg.string(),
                                  "--site",        site,
                                  "--rank",        std::to_string(rank),
                                  "--coordinator", "127.0.0.1:" + std::to_string(port),
                                  "--no-progress"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    // A restarted rank appends to its log, so the first life's output stays readable.
    const fs::path log = dir / (site + "-" + std::to_string(rank) + ".log");
    return Process::start(args, extra_args.empty() ? log : fs::path(log.string() + ".2"), env);
  }
};

}  // namespace desloc::test
