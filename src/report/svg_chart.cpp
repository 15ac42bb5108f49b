// SVG line charts: axis ranges and ticks, coordinate mapping, and the markup itself.
// Output is deterministic (no ids, no clock) so that reports diff cleanly between runs.
#include "desloc/report/svg_chart.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "desloc/core/file_io.hpp"

namespace desloc::report {
namespace {

// Okabe-Ito palette, ordered for contrast on white; yellow is last because it is faint.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
constexpr std::size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
// Series beyond the palette reuse its colours with these dash patterns.
constexpr const char* kDashes[] = {"", "6 3", "2 2", "8 3 2 3"};
constexpr std::size_t kDashCount = sizeof(kDashes) / sizeof(kDashes[0]);

constexpr double kCharWidth = 6.6;  // approximate advance of a 11-12 px sans-serif glyph
constexpr int kMaxMarkers = 40;     // sparse series (eval curves) get a dot per point

struct Tick {
  double value;       // in data units
  std::string label;  // SVG text content (may hold a <tspan>); empty for an unlabelled minor
  bool major;
};

// One axis: the data range after nice rounding, and where its ticks go.
struct Axis {
  bool log = false;
  double lo = 0.0, hi = 1.0;  // data units (log axes: positive)
  std::vector<Tick> ticks;

  // Fraction 0..1 of the way from lo to hi.
  double fraction(double v) const {
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
};

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0.0); }

// 1, 2 or 5 times a power of ten, close to range / target.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double f = norm < 1.5 ? 1.0 : norm < 3.0 ? 2.0 : norm < 7.0 ? 5.0 : 10.0;
  return f * mag;
}

std::string linear_label(double v, double step, double max_abs) {
  if (max_abs >= 1e6 || max_abs < 1e-3) {
    if (v == 0.0) return "0";
    std::string s = fmt::format("{:.3g}", v);  // "2e+07" -> "2e7", "5e-06" -> "5e-6"
    if (const auto e = s.find('e'); e != std::string::npos) {
      std::size_t digits = e + 1;
      const bool negative = s[digits] == '-';
      if (s[digits] == '+' || s[digits] == '-') s.erase(digits, 1);
      while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
      if (negative) s.insert(digits, "-");
    }
    return s;
  }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  std::string s = fmt::format("{:.{}f}", v, decimals);
  if (s.find_first_not_of("-0.") == std::string::npos) s = "0";  // no "-0.0"
  return s;
}

// "10^k" with a superscript exponent outside the range where plain digits read well.
std::string decade_label(int mantissa, int k) {
  if (k >= -3 && k <= 4) {
    const double v = mantissa * std::pow(10.0, k);
    return k >= 0 ? fmt::format("{:.0f}", v) : fmt::format("{:.{}f}", v, -k);
  }
  const std::string base = mantissa == 1 ? "10" : fmt::format("{}\u00d710", mantissa);
  return fmt::format(R"({}<tspan dy="-0.5em" font-size="75%">{}</tspan>)", base, k);
}

Axis linear_axis(double lo, double hi) {
  Axis a;
  if (!(lo <= hi)) lo = 0.0, hi = 1.0;  // no data
  if (lo == hi) {  // a constant: centre it in a band of +-10% (or +-1 around zero)
    const double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double step = nice_step(hi - lo, 5);
  a.lo = std::floor(lo / step + 1e-9) * step;
  a.hi = std::ceil(hi / step - 1e-9) * step;
  const double max_abs = std::max(std::abs(a.lo), std::abs(a.hi));
  const auto n = static_cast<long>(std::llround((a.hi - a.lo) / step));
  for (long i = 0; i <= n; ++i) {
    double v = a.lo + static_cast<double>(i) * step;
    if (std::abs(v) < step * 1e-9) v = 0.0;
    a.ticks.push_back({v, linear_label(v, step, max_abs), true});
  }
  return a;
}

Axis log_axis(double lo, double hi) {
  Axis a;
  a.log = true;
  if (!(lo <= hi)) lo = 1.0, hi = 10.0;
  if (lo == hi) lo /= 3.0, hi *= 3.0;  // a constant sits mid-axis, not on a decade edge
  int dlo = static_cast<int>(std::floor(std::log10(lo) + 1e-12));
  int dhi = static_cast<int>(std::ceil(std::log10(hi) - 1e-12));
  if (dhi <= dlo) dhi = dlo + 1;  // a single value or a range inside one decade
  a.lo = std::pow(10.0, dlo);
  a.hi = std::pow(10.0, dhi);
  const int decades = dhi - dlo;
  const int every = decades <= 8 ? 1 : (decades + 7) / 8;  // at most ~8 labelled decades
  const bool label_minor = decades <= 2;  // otherwise a short axis has only two labels
  for (int k = dlo; k <= dhi; ++k) {
    const bool labelled = (k - dlo) % every == 0;
    a.ticks.push_back({std::pow(10.0, k), labelled ? decade_label(1, k) : "", true});
    if (k == dhi || decades > 6) continue;
    for (int m = 2; m <= 9; ++m) {
      const bool lab = label_minor && (m == 2 || m == 5);
      a.ticks.push_back({m * std::pow(10.0, k), lab ? decade_label(m, k) : "", false});
    }
  }
  return a;
}

// Visible width of a tick label, ignoring markup.
std::size_t label_chars(const std::string& label) {
  std::size_t n = 0;
  bool in_tag = false;
  for (unsigned char c : label) {
    if (c == '<') in_tag = true;
    if (!in_tag && (c & 0xC0) != 0x80) ++n;  // count UTF-8 code points, not bytes
    if (c == '>') in_tag = false;
  }
  return n;
}

std::string truncate_name(const std::string& name, std::size_t max_chars) {
  if (name.size() <= max_chars) return name;
  std::size_t cut = max_chars > 1 ? max_chars - 1 : 0;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return name.substr(0, cut) + "\u2026";
}

}  // namespace

std::string series_colour(std::size_t index) { return kPalette[index % kPaletteSize]; }

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// A chart's geometry: the points drawn, the axes over them, and where the plot area lies.
struct Plot {
  std::vector<std::vector<std::pair<double, double>>> points;  // per series, the usable ones
  bool any = false;                                            // any point at all
  Axis ax, ay;
  double width = 0, height = 0;
  double left = 0, right = 0, top = 0, bottom = 0;  // the plot area
  std::size_t max_name_chars = 0;                   // a legend name's longest shown form
  double px(double x) const { return left + ax.fraction(x) * (right - left); }
  double py(double y) const { return bottom - ay.fraction(y) * (bottom - top); }
};

// Data extents over the points that will be drawn; the legend sits right of the plot so it
// never covers a curve.
Plot layout(const std::vector<Series>& series, const ChartOptions& opts) {
  Plot p;
  p.width = std::max(opts.width, 200);
  p.height = std::max(opts.height, 150);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double xlo = kInf, xhi = -kInf, ylo = kInf, yhi = -kInf;
  p.points.resize(series.size());
  for (std::size_t s = 0; s < series.size(); ++s) {
    const auto n = std::min(series[s].x.size(), series[s].y.size());
    for (std::size_t i = 0; i < n; ++i) {
      const double x = series[s].x[i], y = series[s].y[i];
      if (!usable(x, opts.log_x) || !usable(y, opts.log_y)) continue;
      p.points[s].emplace_back(x, y);
      xlo = std::min(xlo, x), xhi = std::max(xhi, x);
      ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  }
  p.any = xlo <= xhi;
  p.ax = opts.log_x ? log_axis(xlo, xhi) : linear_axis(xlo, xhi);
  p.ay = opts.log_y ? log_axis(ylo, yhi) : linear_axis(ylo, yhi);
  std::size_t ylabel_chars = 1, name_chars = 0;
  for (const auto& t : p.ay.ticks) ylabel_chars = std::max(ylabel_chars, label_chars(t.label));
  for (const auto& s : series) name_chars = std::max(name_chars, label_chars(s.name));
  p.max_name_chars = static_cast<std::size_t>(p.width * 0.3 / kCharWidth);
  name_chars = std::min(name_chars, p.max_name_chars);
  const double legend_w = series.empty() ? 0.0 : 36.0 + kCharWidth * double(name_chars);
  p.left = 34.0 + kCharWidth * double(ylabel_chars);
  p.right = p.width - 16.0 - legend_w;
  p.top = opts.title.empty() ? 16.0 : 40.0;
  p.bottom = p.height - (opts.x_label.empty() ? 30.0 : 48.0);
  return p;
}

// Grid lines and ticks: majors solid grey, log minors fainter.
std::string grid(const Plot& p) {
  std::string out = "<g class=\"grid\">\n";
  for (const auto& t : p.ax.ticks) {
    const double x = p.px(t.value);
    out += fmt::format(
        R"(<line x1="{0:.2f}" y1="{1:.2f}" x2="{0:.2f}" y2="{2:.2f}" stroke="{3}" stroke-width="1"/>)"
        "\n",
        x, p.top, p.bottom, t.major ? "#dddddd" : "#f0f0f0");
    out += fmt::format(
        R"(<line x1="{0:.2f}" y1="{1:.2f}" x2="{0:.2f}" y2="{2:.2f}" stroke="#333333"/>)"
        "\n",
        x, p.bottom, p.bottom + (t.major ? 5.0 : 3.0));
    if (!t.label.empty())
      out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" text-anchor="middle">{}</text>)"
                         "\n",
                         x, p.bottom + 18.0, t.label);
  }
  for (const auto& t : p.ay.ticks) {
    const double y = p.py(t.value);
    out += fmt::format(
        R"(<line x1="{0:.2f}" y1="{1:.2f}" x2="{2:.2f}" y2="{1:.2f}" stroke="{3}" stroke-width="1"/>)"
        "\n",
        p.left, y, p.right, t.major ? "#dddddd" : "#f0f0f0");
    out += fmt::format(R"(<line x1="{:.2f}" y1="{:.2f}" x2="{:.2f}" y2="{:.2f}" stroke="#333333"/>)"
                       "\n",
                       p.left - (t.major ? 5.0 : 3.0), y, p.left, y);
    if (!t.label.empty())
      out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" text-anchor="end">{}</text>)"
                         "\n",
                         p.left - 8.0, y + 4.0, t.label);
  }
  return out + "</g>\n";
}

// The plot's frame, the axis labels, and "no data" when nothing is drawn.
std::string frame(const Plot& p, const ChartOptions& opts) {
  std::string out = fmt::format(
      R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="none" stroke="#333333"/>)"
      "\n",
      p.left, p.top, p.right - p.left, p.bottom - p.top);
  if (!opts.x_label.empty())
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" text-anchor="middle">{}</text>)"
                       "\n",
                       (p.left + p.right) / 2, p.height - 10.0, xml_escape(opts.x_label));
  if (!opts.y_label.empty())
    out += fmt::format(
        R"svg(<text transform="translate(14 {:.2f}) rotate(-90)" text-anchor="middle">{}</text>)svg"
        "\n",
        (p.top + p.bottom) / 2, xml_escape(opts.y_label));
  if (!p.any)
    out += fmt::format(
        R"(<text x="{:.2f}" y="{:.2f}" text-anchor="middle" fill="#777777">no data</text>)"
        "\n",
        (p.left + p.right) / 2, (p.top + p.bottom) / 2);
  return out;
}

std::string dash_attribute(std::size_t s) {
  const char* dash = kDashes[(s / kPaletteSize) % kDashCount];
  return *dash != '\0' ? fmt::format(R"( stroke-dasharray="{}")", dash) : std::string();
}

// Each series' line (with markers where it has few points), then the legend beside the plot.
std::string curves_and_legend(const Plot& p, const std::vector<Series>& series) {
  std::string out;
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = kPalette[s % kPaletteSize];
    std::string pts;
    for (const auto& [x, y] : p.points[s]) pts += fmt::format("{:.2f},{:.2f} ", p.px(x), p.py(y));
    if (!pts.empty()) pts.pop_back();
    out += fmt::format(R"(<polyline data-series="{}" fill="none" stroke="{}" stroke-width="1.8"{} )"
                       R"(stroke-linejoin="round" points="{}"/>)"
                       "\n",
                       xml_escape(series[s].name), colour, dash_attribute(s), pts);
    if (p.points[s].size() <= static_cast<std::size_t>(kMaxMarkers))
      for (const auto& [x, y] : p.points[s])
        out += fmt::format(R"(<circle cx="{:.2f}" cy="{:.2f}" r="2.5" fill="{}"/>)"
                           "\n",
                           p.px(x), p.py(y), colour);
  }
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = kPalette[s % kPaletteSize];
    const double lx = p.right + 12.0, ly = p.top + 10.0 + 18.0 * double(s);
    out += fmt::format(
        R"(<line x1="{:.2f}" y1="{:.2f}" x2="{:.2f}" y2="{:.2f}" stroke="{}" stroke-width="2.5"{}/>)"
        "\n",
        lx, ly, lx + 20.0, ly, colour, dash_attribute(s));
    const std::string shown = truncate_name(series[s].name, p.max_name_chars);
    // A truncated name keeps the full one as a hover tooltip.
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}"><title>{}</title>{}</text>)"
                       "\n",
                       lx + 26.0, ly + 4.0, xml_escape(series[s].name), xml_escape(shown));
  }
  return out;
}

}  // namespace

std::string svg_line_chart(const std::vector<Series>& series, const ChartOptions& opts) {
  const Plot p = layout(series, opts);
  std::string out;
  out += fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(role="img" aria-label="{2}" font-family="Helvetica, Arial, sans-serif" font-size="12">)"
      "\n",
      p.width, p.height, xml_escape(opts.title.empty() ? "chart" : opts.title));
  out += fmt::format(R"(<rect width="{}" height="{}" fill="#ffffff"/>)"
                     "\n",
                     p.width, p.height);
  if (!opts.title.empty())
    out += fmt::format(
        R"(<text x="{:.1f}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>)"
        "\n",
        (p.left + p.right) / 2, xml_escape(opts.title));
  out += grid(p);
  out += frame(p, opts);
  out += curves_and_legend(p, series);
  out += "</svg>\n";
  return out;
}

void write_svg_file(const std::string& path, const std::string& svg) {
  const std::string doc = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg;
  write_file_atomic(path, doc);
}

}  // namespace desloc::report
