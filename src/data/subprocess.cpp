// External programs for corpus preparation: posix_spawnp with a real argument vector (no shell,
// so paths need no quoting) and a polled deadline, so a stuck download cannot hang prepare.
#include "data/subprocess.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "desloc/core/error.hpp"

extern char** environ;

namespace desloc::data {
namespace fs = std::filesystem;
namespace {

// The last `max_lines` lines of the captured output, indented, for an error message.
std::string output_tail(const std::string& log_path, std::size_t max_lines = 15) {
  std::ifstream in(log_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    lines.push_back(line);
    if (lines.size() > max_lines) lines.erase(lines.begin());
  }
  if (lines.empty()) return "";
  std::string out = "\n  its output ended with:";
  for (const auto& line : lines) out += "\n    " + line;
  return out;
}

}  // namespace

std::optional<std::string> find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) == 0) return program;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) dir = ".";
    const fs::path candidate = fs::path(dir) / program;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  }
  return std::nullopt;
}

std::string quote_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& arg : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_./=:+,@%") == std::string::npos;
    if (plain) {
      out += arg;
      continue;
    }
    out += '\'';
    for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

void run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                 const std::string& log_path, const std::string& hint) {
  const std::string shown = quote_command(argv);
  std::vector<char*> cargv;
  for (const auto& arg : argv) cargv.push_back(const_cast<char*>(arg.c_str()));
  cargv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw DataError("cannot run `" + shown + "`: " + std::strerror(rc) + "; " + hint);

  // Poll rather than block so the deadline holds; 20 ms is negligible next to a download.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR)
      throw DataError("waiting for `" + shown + "` failed: " + std::strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      throw DataError("`" + shown + "` did not finish within " + std::to_string(timeout.count()) +
                      " s and was killed; " + hint + output_tail(log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  // posix_spawnp reports a failed exec as exit status 127 on some libcs.
  const std::string how = WIFEXITED(status)
                              ? "exited with status " + std::to_string(WEXITSTATUS(status))
                              : "was killed by signal " + std::to_string(WTERMSIG(status));
  throw DataError("`" + shown + "` " + how + "; " + hint + output_tail(log_path));
}

}  // namespace desloc::data
