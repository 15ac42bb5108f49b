// The topology of a job: its sites (with the compute step time measured there) and the
// directed links between every pair (bandwidth and latency), as `desloc profile` writes it to
// topology.toml and `desloc plan` reads it.
//
//   [meta]
//   measured_at = "2026-12-02T18:30:00Z"   # free-form provenance, kept as written
//   source = "desloc profile"
//   [[site]]
//   name = "A"
//   step_ms = 88.5          # compute time of one training step of the configured model
//   steal_ms_per_mb = 9.5   # optional: compute time lost per MB the site's averages send while
//                           # they overlap its compute (the communication's CPU)
//   batch = 16              # optional: the batch per rank step_ms was timed at
//   memory_mb = 81000       # optional: the memory one rank of the site can use
//   [[link]]
//   from = "A"
//   to = "B"
//   bandwidth_mbit = 95.6   # payload megabits per second (10^6 bit/s), as measured
//   latency_ms = 0.35       # one-way small-message latency
//   contended_mbit = 90.1   # optional: bandwidth while every pair streams at once
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "desloc/topology/link.hpp"

namespace desloc::topology {

struct SiteProfile {
  std::string name;
  double step_s = 0.0;  // compute time of one step, seconds
  // Compute time lost per wide-area byte the site sends while its averages overlap compute:
  // the communication's CPU where it shares the cores with the compute (desloc profile).
  double steal_s_per_byte = 0.0;
  // Step-to-step noise of the compute: the standard deviation of ln(step time) over the steps
  // desloc profile timed (0 = steady). Where sites share cores a step swings with the scheduler
  // (0.27-0.30 on the 3-site test bed on 2 cores), and the sites then wait for the slowest at
  // every rendezvous: simulate() draws each step from it.
  double step_jitter = 0.0;
  // The batch per rank step_s was timed at (0 = not recorded: the config's). A site of another
  // batch steps in step_s * its batch / this (the planner's and simulator's linear model).
  int batch = 0;
  // The memory a rank of the site can use, bytes (0 = not measured): the planner gives the site
  // no batch whose estimated footprint exceeds it.
  double memory_bytes = 0.0;
};

struct Topology {
  std::vector<SiteProfile> sites;
  std::vector<LinkProfile> links;           // every ordered pair of distinct sites, once
  std::map<std::string, std::string> meta;  // provenance, kept as written
  std::string source;                       // the file it came from, for messages

  // The link from -> to; Error naming both if absent. An index by site position over `links`
  // (a dense from x to table), built at the first lookup and again whenever it no longer
  // matches them (1024 sites have about a million links, and a ring walks 1024 of them per
  // price). Not for concurrent first lookups.
  const LinkProfile& link(std::string_view from, std::string_view to) const;
  // The same by the sites' positions in `sites`.
  const LinkProfile& link(std::size_t from, std::size_t to) const;
  const SiteProfile& site(std::string_view name) const;
  // The position of the site `name` in `sites`; Error naming it if absent. A hash index, kept
  // as the links' is.
  std::size_t site_index(std::string_view name) const;
  // The same, or nullopt where no site has that name.
  std::optional<std::size_t> find_site(std::string_view name) const;
  std::vector<std::string> site_names() const;

 private:
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void index_sites() const;
  void index_links() const;
  mutable std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> site_index_;
  mutable std::vector<std::uint32_t> link_index_;  // [from x sites + to]: position in links
};

// Parses and validates: ConfigError naming file:line:column and what is wrong for a syntax
// error, an unknown key, a duplicate site, a link naming an unknown site or a site to itself,
// a duplicate or missing link (every ordered pair is required), and a bandwidth, latency or
// step time that is zero, negative or not a number.
Topology parse_topology(std::string_view text, const std::string& source_name);
Topology load_topology(const std::string& path);

// The TOML text parse_topology reads back to the same values.
std::string to_toml(const Topology& t);

}  // namespace desloc::topology
