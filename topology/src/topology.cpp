// topology.toml: reading with every check the planner relies on, and writing.
#include "desloc/topology/topology.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "desloc/core/error.hpp"
#include "desloc/core/toml_number.hpp"

namespace desloc::topology {
namespace {

constexpr double kMaxStepJitter = 2.0;  // site.step_jitter's bound (SiteProfile)
// From this many sites on, to_toml writes the links as matrices ([links]).
constexpr std::size_t kMatrixSites = 32;

std::string where(const std::string& file, const toml::source_region& r) {
  return fmt::format("{}:{}:{}", file, r.begin.line, r.begin.column);
}

// Reads one table's keys, rejecting unknown ones.
class Reader {
 public:
  Reader(const std::string& file, const toml::table& t, std::string what)
      : file_(file), table_(t), what_(std::move(what)) {}

  std::string string(const char* key) {
    const toml::node* n = need(key);
    if (!n->is_string())
      throw ConfigError(
          fmt::format("{}: {}.{} must be a string", where(file_, n->source()), what_, key));
    return n->as_string()->get();
  }
  bool has(const char* key) const { return table_.get(key) != nullptr; }
  // A finite, positive number (zero too when allow_zero).
  double positive(const char* key, bool allow_zero = false) {
    const toml::node* n = need(key);
    const std::optional<double> number = toml_number(*n);
    if (!number)
      throw ConfigError(
          fmt::format("{}: {}.{} must be a number", where(file_, n->source()), what_, key));
    const double v = *number;
    if (!std::isfinite(v) || v < 0 || (v == 0 && !allow_zero))
      throw ConfigError(fmt::format("{}: {}.{} = {} must be a finite number {} 0",
                                    where(file_, n->source()), what_, key, v,
                                    allow_zero ? ">=" : ">"));
    return v;
  }
  void done() const {
    for (auto&& [k, v] : table_)
      if (!used_.contains(std::string(k.str())))
        throw ConfigError(
            fmt::format("{}: unknown key '{}' in {}", where(file_, k.source()), k.str(), what_));
  }
  std::string location() const { return where(file_, table_.source()); }

 private:
  const toml::node* need(const char* key) {
    used_.insert(key);
    const toml::node* n = table_.get(key);
    if (n == nullptr)
      throw ConfigError(
          fmt::format("{}: {} has no '{}'", where(file_, table_.source()), what_, key));
    return n;
  }
  const std::string& file_;
  const toml::table& table_;
  std::string what_;
  std::set<std::string> used_;
};

const toml::array* array_of_tables(const toml::table& root, const char* key,
                                   const std::string& file) {
  const toml::node* n = root.get(key);
  if (n == nullptr) return nullptr;
  const toml::array* a = n->as_array();
  if (a == nullptr || !a->is_array_of_tables())
    throw ConfigError(fmt::format("{}: '{}' must be an array of tables ([[{}]])",
                                  where(file, n->source()), key, key));
  return a;
}

// One n x n matrix of [links] (`key`): rows of numbers, the diagonal unread; empty when the
// matrix is optional and absent.
std::vector<std::vector<double>> matrix_of(const toml::table& links, const char* key, std::size_t n,
                                           const std::string& file, bool optional,
                                           bool allow_zero) {
  const toml::node* node = links.get(key);
  if (node == nullptr) {
    if (optional) return {};
    throw ConfigError(fmt::format("{}: [links] has no '{}'", where(file, links.source()), key));
  }
  const toml::array* rows = node->as_array();
  if (rows == nullptr || rows->size() != n)
    throw ConfigError(fmt::format("{}: links.{} must be an array of {} rows, one per [[site]]",
                                  where(file, node->source()), key, n));
  std::vector<std::vector<double>> out(n, std::vector<double>(n, 0.0));
  for (std::size_t i = 0; i < n; ++i) {
    const toml::node& row_node = *rows->get(i);
    const toml::array* row = row_node.as_array();
    if (row == nullptr || row->size() != n)
      throw ConfigError(fmt::format("{}: links.{} row {} must hold {} numbers, one per [[site]]",
                                    where(file, row_node.source()), key, i + 1, n));
    for (std::size_t j = 0; j < n; ++j) {
      const toml::node& cell = *row->get(j);
      const std::optional<double> number = toml_number(cell);
      if (!number)
        throw ConfigError(fmt::format("{}: links.{}[{}][{}] must be a number",
                                      where(file, cell.source()), key, i + 1, j + 1));
      const double v = *number;
      if (i == j) continue;  // a site to itself: no link
      if (!std::isfinite(v) || v < 0 || (v == 0 && !allow_zero))
        throw ConfigError(fmt::format("{}: links.{}[{}][{}] = {} must be a finite number {} 0",
                                      where(file, cell.source()), key, i + 1, j + 1, v,
                                      allow_zero ? ">=" : ">"));
      out[i][j] = v;
    }
  }
  return out;
}

// [links]: the links as matrices, row = from, column = to, in [[site]] order. For many sites:
// a million [[link]] tables take toml++ seconds to build, a million numbers a fraction of one.
void read_link_matrix(const toml::node& node, const std::string& file, Topology& t) {
  const toml::table* links = node.as_table();
  if (links == nullptr)
    throw ConfigError(fmt::format("{}: 'links' must be a table", where(file, node.source())));
  for (auto&& [k, v] : *links)
    if (k.str() != "bandwidth_mbit" && k.str() != "latency_ms" && k.str() != "contended_mbit")
      throw ConfigError(fmt::format(
          "{}: unknown key '{}' in [links] (expected bandwidth_mbit, latency_ms, contended_mbit)",
          where(file, k.source()), k.str()));
  const std::size_t n = t.sites.size();
  const auto bandwidth = matrix_of(*links, "bandwidth_mbit", n, file, false, false);
  const auto latency = matrix_of(*links, "latency_ms", n, file, false, true);
  const auto contended = matrix_of(*links, "contended_mbit", n, file, true, true);
  t.links.reserve(n * (n - 1));
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      LinkProfile l;
      l.from = t.sites[i].name;
      l.to = t.sites[j].name;
      l.bandwidth_bps = bandwidth[i][j] * 1e6 / 8;
      l.latency_s = latency[i][j] / 1e3;
      if (!contended.empty()) l.contended_bps = contended[i][j] * 1e6 / 8;
      t.links.push_back(std::move(l));
    }
}

Topology from_table(const toml::table& root, const std::string& file) {
  Topology t;
  t.source = file;
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (key != "meta" && key != "site" && key != "link" && key != "links")
      throw ConfigError(
          fmt::format("{}: unknown table '{}' (expected [meta], [[site]], and [[link]] or [links])",
                      where(file, k.source()), key));
  }
  if (const toml::node* meta = root.get("meta")) {
    if (!meta->is_table())
      throw ConfigError(fmt::format("{}: 'meta' must be a table", where(file, meta->source())));
    for (auto&& [k, v] : *meta->as_table()) {
      if (!v.is_string())
        throw ConfigError(
            fmt::format("{}: meta.{} must be a string", where(file, v.source()), k.str()));
      t.meta[std::string(k.str())] = v.as_string()->get();
    }
  }
  const toml::array* sites = array_of_tables(root, "site", file);
  if (sites == nullptr || sites->empty())
    throw ConfigError(fmt::format("{}: no [[site]] tables; a topology needs its sites", file));
  std::set<std::string> names;
  for (const toml::node& n : *sites) {
    Reader r(file, *n.as_table(), "site");
    SiteProfile s;
    s.name = r.string("name");
    s.step_s = r.positive("step_ms") / 1e3;
    if (r.has("steal_ms_per_mb"))
      s.steal_s_per_byte = r.positive("steal_ms_per_mb", /*allow_zero=*/true) / 1e9;
    if (r.has("step_jitter")) {
      s.step_jitter = r.positive("step_jitter", /*allow_zero=*/true);
      if (s.step_jitter >= kMaxStepJitter)
        throw ConfigError(fmt::format(
            "{}: site.step_jitter = {} is not a step's noise: the standard deviation of "
            "ln(step time) must be below {} (at 2 a step's 90th percentile is 13x its median)",
            r.location(), s.step_jitter, kMaxStepJitter));
    }
    if (r.has("batch")) {
      const double b = r.positive("batch");
      if (b != std::floor(b) || b > 1e9)
        throw ConfigError(fmt::format(
            "{}: site.batch = {} must be a whole number of sequences (the batch per rank "
            "step_ms was timed at)",
            r.location(), b));
      s.batch = static_cast<int>(b);
    }
    if (r.has("memory_mb")) s.memory_bytes = r.positive("memory_mb") * 1e6;
    r.done();
    if (!names.insert(s.name).second)
      throw ConfigError(fmt::format("{}: duplicate site '{}'", r.location(), s.name));
    t.sites.push_back(std::move(s));
  }
  // Each ordered pair once, by the sites' positions: a million links at 1024 sites.
  const std::size_t count = t.sites.size();
  std::vector<char> linked(count * count, 0);
  if (const toml::node* matrix = root.get("links")) {
    if (root.get("link") != nullptr)
      throw ConfigError(fmt::format(
          "{}: [links] and [[link]] both give the links; use one (the matrix for many sites)",
          where(file, matrix->source())));
    read_link_matrix(*matrix, file, t);
    return t;
  }
  if (const toml::array* links = array_of_tables(root, "link", file)) {
    t.links.reserve(links->size());
    for (const toml::node& n : *links) {
      Reader r(file, *n.as_table(), "link");
      LinkProfile l;
      l.from = r.string("from");
      l.to = r.string("to");
      l.bandwidth_bps = r.positive("bandwidth_mbit") * 1e6 / 8;
      l.latency_s = r.positive("latency_ms", /*allow_zero=*/true) / 1e3;
      if (r.has("contended_mbit")) l.contended_bps = r.positive("contended_mbit") * 1e6 / 8;
      r.done();
      const std::optional<std::size_t> from = t.find_site(l.from), to = t.find_site(l.to);
      for (const auto& [end, at] : {std::pair{&l.from, from}, std::pair{&l.to, to}})
        if (!at)
          throw ConfigError(fmt::format("{}: link {} -> {} names unknown site '{}' (sites: {})",
                                        r.location(), l.from, l.to, *end, fmt::join(names, ", ")));
      if (l.from == l.to)
        throw ConfigError(fmt::format("{}: link from '{}' to itself", r.location(), l.from));
      char& seen = linked[*from * count + *to];
      if (seen != 0)
        throw ConfigError(fmt::format("{}: duplicate link {} -> {}", r.location(), l.from, l.to));
      seen = 1;
      t.links.push_back(std::move(l));
    }
  }
  std::vector<std::string> missing;
  for (std::size_t a = 0; a < count; ++a)
    for (std::size_t b = 0; b < count; ++b)
      if (a != b && linked[a * count + b] == 0)
        missing.push_back(t.sites[a].name + " -> " + t.sites[b].name);
  if (!missing.empty())
    throw ConfigError(fmt::format(
        "{}: missing link(s) {}; every ordered pair of sites needs a measured link (run "
        "`desloc profile`)",
        file, fmt::join(missing, ", ")));
  return t;
}

}  // namespace

namespace {
constexpr std::uint32_t kNoLink = 0xffffffffu;
}  // namespace

void Topology::index_sites() const {
  site_index_.clear();
  site_index_.reserve(sites.size());
  for (std::size_t i = 0; i < sites.size(); ++i) site_index_.emplace(sites[i].name, i);
}

std::optional<std::size_t> Topology::find_site(std::string_view name) const {
  const auto valid = [&](std::size_t i) { return i < sites.size() && sites[i].name == name; };
  if (auto it = site_index_.find(name); it != site_index_.end() && valid(it->second))
    return it->second;
  // Not built yet, or built before `sites` changed: rebuild and look again.
  index_sites();
  if (auto it = site_index_.find(name); it != site_index_.end() && valid(it->second))
    return it->second;
  return std::nullopt;
}

std::size_t Topology::site_index(std::string_view name) const {
  if (const std::optional<std::size_t> i = find_site(name)) return *i;
  throw Error(fmt::format("{}: no site '{}'", source, name));
}

const SiteProfile& Topology::site(std::string_view name) const { return sites[site_index(name)]; }

void Topology::index_links() const {
  const std::size_t n = sites.size();
  link_index_.assign(n * n, kNoLink);
  for (std::size_t i = 0; i < links.size(); ++i) {
    const auto a = site_index_.find(std::string_view(links[i].from));
    const auto b = site_index_.find(std::string_view(links[i].to));
    if (a == site_index_.end() || b == site_index_.end()) continue;  // named in no lookup
    link_index_[a->second * n + b->second] = static_cast<std::uint32_t>(i);
  }
}

const LinkProfile& Topology::link(std::size_t from, std::size_t to) const {
  const std::size_t n = sites.size();
  if (from >= n || to >= n)
    throw Error(
        fmt::format("{}: no link between site positions {} and {} of {}", source, from, to, n));
  const auto valid = [&](std::uint32_t i) {
    return i < links.size() && links[i].from == sites[from].name && links[i].to == sites[to].name;
  };
  if (link_index_.size() == n * n && valid(link_index_[from * n + to]))
    return links[link_index_[from * n + to]];
  // Not built yet, or built before `sites` or `links` changed: rebuild and look again.
  index_sites();
  index_links();
  if (valid(link_index_[from * n + to])) return links[link_index_[from * n + to]];
  throw Error(fmt::format("{}: no link {} -> {}", source, sites[from].name, sites[to].name));
}

const LinkProfile& Topology::link(std::string_view from, std::string_view to) const {
  const std::optional<std::size_t> a = find_site(from), b = find_site(to);
  if (!a || !b) throw Error(fmt::format("{}: no link {} -> {}", source, from, to));
  return link(*a, *b);
}

std::vector<std::string> Topology::site_names() const {
  std::vector<std::string> out;
  for (const auto& s : sites) out.push_back(s.name);
  return out;
}

Topology parse_topology(std::string_view text, const std::string& source_name) {
  try {
    return from_table(toml::parse(text, source_name), source_name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(
        fmt::format("{}: TOML syntax error: {}", where(source_name, e.source()), e.description()));
  }
}

Topology load_topology(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    if (e.source().begin.line == 0)
      throw ConfigError(fmt::format("{}: cannot read topology: {}", path, e.description()));
    throw ConfigError(
        fmt::format("{}: TOML syntax error: {}", where(path, e.source()), e.description()));
  }
  return from_table(root, path);
}

std::string to_toml(const Topology& t) {
  std::ostringstream out;
  out << "# desloc topology: sites with their compute step time, directed links with measured\n"
         "# payload bandwidth and one-way latency.\n[meta]\n";
  for (const auto& [k, v] : t.meta) {
    std::string escaped;
    for (char c : v) {
      if (c == '"' || c == '\\') escaped += '\\';
      if (c != '\n') escaped += c;
    }
    out << fmt::format("{} = \"{}\"\n", k, escaped);
  }
  for (const auto& s : t.sites)
    out << fmt::format(
        "\n[[site]]\nname = \"{}\"\nstep_ms = {:.6g}\n{}{}{}{}", s.name, s.step_s * 1e3,
        s.steal_s_per_byte > 0 ? fmt::format("steal_ms_per_mb = {:.6g}\n", s.steal_s_per_byte * 1e9)
                               : std::string(),
        s.step_jitter > 0 ? fmt::format("step_jitter = {:.4g}\n", s.step_jitter) : std::string(),
        s.batch > 0 ? fmt::format("batch = {}\n", s.batch) : std::string(),
        s.memory_bytes > 0 ? fmt::format("memory_mb = {:.6g}\n", s.memory_bytes / 1e6)
                           : std::string());
  if (t.sites.size() < kMatrixSites) {
    for (const auto& l : t.links)
      out << fmt::format(
          "\n[[link]]\nfrom = \"{}\"\nto = \"{}\"\nbandwidth_mbit = {:.6g}\nlatency_ms = "
          "{:.6g}\n{}",
          l.from, l.to, l.bandwidth_bps * 8 / 1e6, l.latency_s * 1e3,
          l.contended_bps > 0 ? fmt::format("contended_mbit = {:.6g}\n", l.contended_bps * 8 / 1e6)
                              : std::string());
    return out.str();
  }
  // Many sites: the links as matrices (row = from, column = to, in [[site]] order).
  const bool contended = std::any_of(t.links.begin(), t.links.end(),
                                     [](const LinkProfile& l) { return l.contended_bps > 0; });
  const auto matrix = [&](const char* key, auto value) {
    out << key << " = [\n";
    for (std::size_t i = 0; i < t.sites.size(); ++i) {
      out << "  [";
      for (std::size_t j = 0; j < t.sites.size(); ++j)
        out << (j > 0 ? ", " : "")
            << (i == j ? std::string("0") : fmt::format("{:.6g}", value(t.link(i, j))));
      out << "],\n";
    }
    out << "]\n";
  };
  out << "\n# The links, row = from, column = to, in the order of the [[site]] tables above.\n"
         "[links]\n";
  matrix("bandwidth_mbit", [](const LinkProfile& l) { return l.bandwidth_bps * 8 / 1e6; });
  matrix("latency_ms", [](const LinkProfile& l) { return l.latency_s * 1e3; });
  if (contended)
    matrix("contended_mbit", [](const LinkProfile& l) { return l.contended_bps * 8 / 1e6; });
  return out.str();
}

}  // namespace desloc::topology
