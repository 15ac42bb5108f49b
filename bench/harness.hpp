// The shared benchmark harness: timing (warmup, repeats, median [min-max]), a table printer,
// a peer subprocess with a line protocol and deadlines, and the measured sgemm peak of the
// cores a benchmark runs on. Header-only: bench/CMakeLists.txt builds every bench_*.cpp as a
// program and nothing else.
#pragma once

#include <cblas.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace desloc::bench {

// A benchmark failed to run or to validate; main() prints it and exits non-zero.
class BenchError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------------
// Arguments

// The benchmarks' "--name VALUE" (or "--name=VALUE") parser: each flag binds to one variable.
// Numbers are read whole (a value with trailing text is an error naming the flag); --help prints
// the usage.
class Flags {
 public:
  explicit Flags(std::string usage) : usage_(std::move(usage)) {}
  Flags& add(const char* name, std::string& v) {
    return bind(name, [&v](const std::string&, const char* s) { v = s; });
  }
  Flags& add(const char* name, int& v) { return integer(name, v); }
  Flags& add(const char* name, std::int64_t& v) { return integer(name, v); }
  Flags& add(const char* name, std::size_t& v) { return integer(name, v); }
  Flags& add(const char* name, double& v) {
    return bind(name, [&v](const std::string& flag, const char* s) {
      char* end = nullptr;
      v = std::strtod(s, &end);
      if (end == s || *end != '\0') throw BenchError(flag + ": bad number '" + s + "'");
    });
  }
  // A comma-separated list of integers, e.g. --kx 16,256.
  Flags& add(const char* name, std::vector<std::int64_t>& v) {
    return bind(name, [&v](const std::string& flag, const char* s) {
      v.clear();
      std::string_view rest(s);
      while (!rest.empty()) {
        const std::size_t comma = std::min(rest.find(','), rest.size());
        v.push_back(parse_integer<std::int64_t>(flag, std::string(rest.substr(0, comma))));
        rest.remove_prefix(std::min(comma + 1, rest.size()));
      }
    });
  }
  // A switch without a value, e.g. --codecs.
  Flags& add(const char* name, bool& v) {
    switches_[name] = &v;
    return *this;
  }
  // Throws BenchError for an unknown flag, a missing value or a bad number; --help (or -h)
  // prints the usage and exits.
  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::puts(usage_.c_str());
        std::exit(0);
      }
      if (const auto sw = switches_.find(a); sw != switches_.end()) {
        *sw->second = true;
        continue;
      }
      const std::size_t eq = a.find('=');  // --name=VALUE, or --name VALUE
      const std::string name = a.substr(0, eq);
      const auto it = setters_.find(name);
      if (it == setters_.end()) throw BenchError("unknown option '" + name + "'\n" + usage_);
      if (eq != std::string::npos) {
        it->second(name, a.c_str() + eq + 1);
        continue;
      }
      if (i + 1 >= argc) throw BenchError("option " + name + " needs a value");
      it->second(name, argv[++i]);
    }
  }

 private:
  template <class T>
  static T parse_integer(const std::string& flag, const std::string& s) {
    T v{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size())
      throw BenchError(flag + ": bad integer '" + s + "'");
    return v;
  }
  template <class T>
  Flags& integer(const char* name, T& v) {
    return bind(name,
                [&v](const std::string& flag, const char* s) { v = parse_integer<T>(flag, s); });
  }
  Flags& bind(const char* name, std::function<void(const std::string&, const char*)> set) {
    setters_[name] = std::move(set);
    return *this;
  }
  std::string usage_;
  std::map<std::string, std::function<void(const std::string&, const char*)>> setters_;
  std::map<std::string, bool*> switches_;
};

// ---------------------------------------------------------------------------------------------
// Timing

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median with its spread over the repeats; all in the unit of the samples.
struct Stats {
  double median = 0, min = 0, max = 0;
  int n = 0;
};

inline Stats summarize(std::vector<double> samples) {
  if (samples.empty()) throw BenchError("summarize: no samples");
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  Stats s;
  s.n = static_cast<int>(n);
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  return s;
}

// Runs fn() `warmup` times untimed, then `repeats` times, each timed on its own (ms).
template <class Fn>
std::vector<double> time_ms(Fn&& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_s();
    fn();
    ms.push_back(1e3 * (now_s() - t0));
  }
  return ms;
}

// "12.3 [11.9-14.0]": median [min-max] with `digits` decimals.
inline std::string fmt_stats(const Stats& s, int digits = 1) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%.*f [%.*f-%.*f]", digits, s.median, digits, s.min, digits,
                s.max);
  return buf;
}

// Scientific notation, e.g. fmt_sci(8.6e-8) == "8.6e-08".
inline std::string fmt_sci(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*e", digits, v);
  return buf;
}

inline std::string fmt(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The 1/5/15-minute load averages, printed next to results: on a shared machine a load above
// the core count means every number is inflated, and ratios are what to trust.
inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "unknown";
  return a + " " + b + " " + c;
}

// ---------------------------------------------------------------------------------------------
// Table printer: left-aligned first column, right-aligned others.

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }
  void print(std::FILE* out = stdout) const {
    std::vector<std::size_t> w(header_.size());
    for (std::size_t c = 0; c < w.size(); ++c) {
      w[c] = header_[c].size();
      for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& r) {
      for (std::size_t c = 0; c < w.size(); ++c) {
        const int width = static_cast<int>(w[c]);
        if (c == 0)
          std::fprintf(out, "%-*s", width, r[c].c_str());
        else
          std::fprintf(out, "  %*s", width, r[c].c_str());
      }
      std::fprintf(out, "\n");
    };
    line(header_);
    std::size_t total = 0;
    for (auto x : w) total += x + 2;
    std::fprintf(out, "%s\n", std::string(total - 2, '-').c_str());
    for (const auto& r : rows_) line(r);
    std::fflush(out);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// ---------------------------------------------------------------------------------------------
// Minimal JSON field extraction for the one-line JSON records peers print. Enough for flat
// objects of numbers, strings and arrays of numbers; not a general parser.

inline std::size_t json_value_pos(const std::string& line, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  std::size_t p = line.find(quoted);
  if (p == std::string::npos) throw BenchError("peer record lacks \"" + key + "\": " + line);
  p = line.find(':', p + quoted.size());
  if (p == std::string::npos) throw BenchError("malformed peer record: " + line);
  ++p;
  while (p < line.size() && std::isspace(static_cast<unsigned char>(line[p]))) ++p;
  return p;
}

inline double json_number(const std::string& line, const std::string& key) {
  const std::size_t p = json_value_pos(line, key);
  char* end = nullptr;
  const double v = std::strtod(line.c_str() + p, &end);
  if (end == line.c_str() + p) throw BenchError("\"" + key + "\" is not a number in: " + line);
  return v;
}

inline std::string json_string(const std::string& line, const std::string& key) {
  const std::size_t p = json_value_pos(line, key);
  if (p >= line.size() || line[p] != '"') throw BenchError("\"" + key + "\" is not a string");
  const std::size_t e = line.find('"', p + 1);
  return line.substr(p + 1, e - p - 1);
}

inline std::vector<double> json_numbers(const std::string& line, const std::string& key) {
  std::size_t p = json_value_pos(line, key);
  if (p >= line.size() || line[p] != '[') throw BenchError("\"" + key + "\" is not an array");
  std::vector<double> out;
  const char* s = line.c_str() + p + 1;
  while (true) {
    while (*s == ' ' || *s == ',') ++s;
    if (*s == ']' || *s == '\0') break;
    char* end = nullptr;
    out.push_back(std::strtod(s, &end));
    if (end == s) throw BenchError("bad number in \"" + key + "\": " + line);
    s = end;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Peer subprocess: argv with extra environment, stdin/stdout pipes, line protocol, and a
// deadline on every read. stderr is inherited so the peer's tracebacks reach the user.

class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
    if (argv.empty()) throw BenchError("Subprocess: empty argv");
    int in_pipe[2], out_pipe[2];
    if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0)
      throw BenchError(std::string("pipe: ") + std::strerror(errno));
    // Build argv/envp before fork: the child may only call async-signal-safe functions.
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_storage;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (const auto& x : extra_env) overridden |= x.substr(0, x.find('=')) == key;
      if (!overridden) env_storage.push_back(kv);
    }
    for (const auto& x : extra_env) env_storage.push_back(x);
    std::vector<char*> envp;
    for (auto& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);

    pid_ = ::fork();
    if (pid_ < 0) throw BenchError(std::string("fork: ") + std::strerror(errno));
    if (pid_ == 0) {
      ::dup2(in_pipe[0], STDIN_FILENO);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::execve(args[0], args.data(), envp.data());
      const char msg[] = "bench: execve of the peer failed\n";
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    to_child_ = in_pipe[1];
    from_child_ = out_pipe[0];
    what_ = argv.size() > 1 ? argv[1] : argv[0];
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess() {
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
    if (pid_ > 0) {
      // Closing stdin asks the peer to exit; give it a moment, then kill it.
      for (int i = 0; i < 50; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
        ::usleep(20000);
      }
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  void send_line(const std::string& line) {
    const std::string s = line + "\n";
    std::size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::write(to_child_, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw BenchError("peer " + what_ + " closed its stdin (did it crash?)");
      off += static_cast<std::size_t>(n);
    }
  }

  // Next line of the peer's stdout; throws when the peer exits or the deadline passes.
  std::string read_line(double timeout_s) {
    const double deadline = now_s() + timeout_s;
    while (true) {
      const std::size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const double left = deadline - now_s();
      if (left <= 0)
        throw BenchError("peer " + what_ + " sent no line within " + fmt(timeout_s, 0) + " s");
      pollfd pfd{from_child_, POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(left * 1e3) + 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(from_child_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int status = 0;
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
        const std::string how = WIFEXITED(status)
                                    ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                    : "was killed by signal " + std::to_string(WTERMSIG(status));
        throw BenchError("peer " + what_ + " " + how +
                         " before answering (127: the interpreter could not be started); see "
                         "its stderr above");
      }
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Reads lines until one that starts with '{' (a JSON record); other lines are echoed.
  std::string read_record(double timeout_s) {
    while (true) {
      std::string line = read_line(timeout_s);
      if (!line.empty() && line[0] == '{') return line;
      std::fprintf(stderr, "[peer] %s\n", line.c_str());
    }
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buf_, what_;
};

// ---------------------------------------------------------------------------------------------
// Scratch directory removed on scope exit (unless keep()).

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw BenchError(std::string("mkdtemp: ") + std::strerror(errno));
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!keep_) std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  std::filesystem::path path_;
  bool keep_ = false;
};

template <class T>
void write_raw(const std::filesystem::path& p, const T* data, std::size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f) throw BenchError("cannot write " + p.string());
}

template <class T>
std::vector<T> read_raw(const std::filesystem::path& p, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f || f.peek() != EOF)
    throw BenchError(p.string() + ": expected exactly " + std::to_string(n * sizeof(T)) + " bytes");
  return v;
}

// ---------------------------------------------------------------------------------------------
// The physical limit: the sgemm rate of these cores at `threads` threads (GFLOP/s), measured
// as the best of `trials` square n^3 cblas_sgemm calls after one warmup call.

inline double sgemm_peak_gflops(int threads, int n = 2048, int trials = 5) {
  openblas_set_num_threads(threads);
  const std::size_t nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(nn), b(nn), c(nn, 0.0f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  };
  gemm();
  double best_s = 1e30;
  for (int i = 0; i < trials; ++i) {
    const double t0 = now_s();
    gemm();
    best_s = std::min(best_s, now_s() - t0);
  }
  // Validate one entry against a double-precision dot product before trusting the rate.
  double ref = 0;
  for (int k = 0; k < n; ++k)
    ref += static_cast<double>(a[static_cast<std::size_t>(k)]) * b[static_cast<std::size_t>(k) * n];
  if (std::abs(ref - c[0]) > 1e-3 * std::sqrt(static_cast<double>(n)))
    throw BenchError("sgemm peak: cblas_sgemm result is wrong (c[0] = " + fmt(c[0], 6) +
                     ", expected " + fmt(ref, 6) + ")");
  return 2.0 * n * static_cast<double>(n) * n / best_s / 1e9;
}

}  // namespace desloc::bench
