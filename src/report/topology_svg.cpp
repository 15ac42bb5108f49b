// Topology diagram and bandwidth heatmap as SVG.
#include "desloc/report/topology_svg.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "desloc/report/svg_chart.hpp"

namespace desloc::report {
namespace {

std::string mbit(double bytes_per_s) {
  const double m = bytes_per_s * 8 / 1e6;
  return m >= 1000 ? fmt::format("{:.2f} Gbit/s", m / 1000) : fmt::format("{:.0f} Mbit/s", m);
}

struct Point {
  double x, y;
};

}  // namespace

std::string svg_topology_diagram(const topology::Topology& t, const std::vector<std::string>& ring,
                                 const std::string& title) {
  const int w = 720, h = 560;
  const double cx = w / 2.0, cy = h / 2.0 + 15, radius = std::min(w, h) * 0.33;
  const std::size_t n = t.sites.size();
  std::vector<Point> at(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double a = -std::numbers::pi / 2 + 2 * std::numbers::pi * double(i) / double(n);
    at[i] = {cx + radius * std::cos(a), cy + radius * std::sin(a)};
  }
  auto index = [&](const std::string& name) {
    for (std::size_t i = 0; i < n; ++i)
      if (t.sites[i].name == name) return i;
    return n;
  };
  std::string svg = fmt::format(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" )svg"
      R"svg(font-family="sans-serif" font-size="12">)svg"
      R"svg(<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" )svg"
      R"svg(markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" )svg"
      R"svg(fill="#D55E00"/></marker></defs>)svg"
      R"svg(<rect width="100%" height="100%" fill="white"/>)svg"
      R"svg(<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>)svg",
      w, h, w, h, w / 2, xml_escape(title));
  // Links: one line per unordered pair, labelled with both directions.
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j) {
      const auto& ab = t.link(t.sites[i].name, t.sites[j].name);
      const auto& ba = t.link(t.sites[j].name, t.sites[i].name);
      const double bw = std::min(ab.bandwidth_bps, ba.bandwidth_bps);
      const double width = 1.0 + 1.5 * std::max(0.0, std::log10(bw * 8 / 1e6));
      svg += fmt::format(
          R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#999" stroke-width="{:.1f}"/>)svg",
          at[i].x, at[i].y, at[j].x, at[j].y, width);
      const double mx = (at[i].x + at[j].x) / 2, my = (at[i].y + at[j].y) / 2;
      const std::string label =
          std::abs(ab.bandwidth_bps - ba.bandwidth_bps) < 0.02 * bw
              ? mbit(bw)
              : fmt::format("{}>{} {} / {}>{} {}", t.sites[i].name, t.sites[j].name,
                            mbit(ab.bandwidth_bps), t.sites[j].name, t.sites[i].name,
                            mbit(ba.bandwidth_bps));
      svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="#333" )svg"
                         R"svg(stroke="white" stroke-width="3" paint-order="stroke">{}</text>)svg",
                         mx, my - 4, xml_escape(label));
    }
  // The ring, as arrows offset inwards so both the link and the ring stay visible.
  for (std::size_t k = 0; ring.size() > 1 && k < ring.size(); ++k) {
    const std::size_t a = index(ring[k]), b = index(ring[(k + 1) % ring.size()]);
    if (a >= n || b >= n) continue;
    const double dx = at[b].x - at[a].x, dy = at[b].y - at[a].y;
    const double len = std::hypot(dx, dy);
    const double ux = dx / len, uy = dy / len;
    const double ox = (cx - (at[a].x + at[b].x) / 2) * 0.08,
                 oy = (cy - (at[a].y + at[b].y) / 2) * 0.08;
    svg += fmt::format(
        R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#D55E00" )svg"
        R"svg(stroke-width="2.5" marker-end="url(#arrow)"/>)svg",
        at[a].x + 34 * ux + ox, at[a].y + 34 * uy + oy, at[b].x - 34 * ux + ox,
        at[b].y - 34 * uy + oy);
  }
  for (std::size_t i = 0; i < n; ++i) {
    svg += fmt::format(
        R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="28" fill="#0072B2"/>)svg"
        R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="white" font-size="14">{}</text>)svg"
        R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="#333" font-size="11">step {:.1f} ms</text>)svg",
        at[i].x, at[i].y, at[i].x, at[i].y + 5, xml_escape(t.sites[i].name), at[i].x, at[i].y + 44,
        t.sites[i].step_s * 1e3);
  }
  if (ring.size() > 1)
    svg += fmt::format(
        R"svg(<text x="12" y="{}" fill="#D55E00">arrows: the wide-area ring {}</text>)svg", h - 12,
        xml_escape(fmt::format("{}", fmt::join(ring, " -> "))) + " -> " + xml_escape(ring[0]));
  svg += "</svg>";
  return svg;
}

std::string svg_bandwidth_heatmap(const topology::Topology& t, const std::string& title) {
  const std::size_t n = t.sites.size();
  const int cell = 78, left = 90, top = 70;
  const int w = std::max(left + cell * static_cast<int>(n) + 30,
                         static_cast<int>(title.size()) * 8 + 40),
            h = top + cell * static_cast<int>(n) + 40;
  double lo = 1e300, hi = 0;
  for (const auto& l : t.links) {
    lo = std::min(lo, l.bandwidth_bps);
    hi = std::max(hi, l.bandwidth_bps);
  }
  std::string svg = fmt::format(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" )svg"
      R"svg(font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>)svg"
      R"svg(<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>)svg"
      R"svg(<text x="{}" y="{}" text-anchor="middle">to</text>)svg"
      R"svg(<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">from</text>)svg",
      w, h, w, h, w / 2, xml_escape(title), left + cell * int(n) / 2, top - 28,
      top + cell * int(n) / 2, top + cell * int(n) / 2);
  for (std::size_t i = 0; i < n; ++i) {
    svg += fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">{}</text>)svg",
                       left + cell * int(i) + cell / 2, top - 8, xml_escape(t.sites[i].name));
    svg += fmt::format(R"svg(<text x="{}" y="{}" text-anchor="end">{}</text>)svg", left - 8,
                       top + cell * int(i) + cell / 2 + 4, xml_escape(t.sites[i].name));
  }
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const int x = left + cell * int(j), y = top + cell * int(i);
      if (i == j) {
        svg += fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="#eee"/>)svg", x,
                           y, cell - 2, cell - 2);
        continue;
      }
      const double bw = t.link(t.sites[i].name, t.sites[j].name).bandwidth_bps;
      // Log scale from the slowest (light) to the fastest (dark blue) link.
      const double f = hi > lo ? std::log(bw / lo) / std::log(hi / lo) : 1.0;
      const int r = int(230 - 230 * f), g = int(240 - 126 * f), b = int(250 - 72 * f);
      svg +=
          fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="rgb({},{},{})"/>)svg"
                      R"svg(<text x="{}" y="{}" text-anchor="middle" fill="{}">{}</text>)svg",
                      x, y, cell - 2, cell - 2, r, g, b, x + cell / 2 - 1, y + cell / 2 + 4,
                      f > 0.55 ? "white" : "#222", xml_escape(mbit(bw)));
    }
  svg += "</svg>";
  return svg;
}

}  // namespace desloc::report
