// Runs an external program (npm, tar) with an argument vector and a deadline, for corpus
// preparation. Private to src/data.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace desloc::data {

// The full path of `program` found on $PATH, or nullopt.
std::optional<std::string> find_program(const std::string& program);

// Runs argv[0] (looked up on $PATH) with argv, stdin from /dev/null and stdout+stderr captured
// to `log_path`. Throws DataError naming the command, the exit status and the output's tail,
// followed by `hint`, if it cannot start, exits non-zero, dies of a signal, or runs past
// `timeout` (then it is killed).
void run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                 const std::string& log_path, const std::string& hint);

// argv as a shell would need it typed, for messages.
std::string quote_command(const std::vector<std::string>& argv);

}  // namespace desloc::data
