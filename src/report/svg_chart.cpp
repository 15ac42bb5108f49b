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

std::string svg_line_chart(const std::vector<Series>& series, const ChartOptions& opts) {
  const double width = std::max(opts.width, 200);
  const double height = std::max(opts.height, 150);

  // Data extents over the points that will be drawn.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double xlo = kInf, xhi = -kInf, ylo = kInf, yhi = -kInf;
  std::vector<std::vector<std::pair<double, double>>> points(series.size());
  for (std::size_t s = 0; s < series.size(); ++s) {
    const auto n = std::min(series[s].x.size(), series[s].y.size());
    for (std::size_t i = 0; i < n; ++i) {
      const double x = series[s].x[i], y = series[s].y[i];
      if (!usable(x, opts.log_x) || !usable(y, opts.log_y)) continue;
      points[s].emplace_back(x, y);
      xlo = std::min(xlo, x), xhi = std::max(xhi, x);
      ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  }
  const bool any = xlo <= xhi;
  const Axis ax = opts.log_x ? log_axis(xlo, xhi) : linear_axis(xlo, xhi);
  const Axis ay = opts.log_y ? log_axis(ylo, yhi) : linear_axis(ylo, yhi);

  // Layout: the legend sits right of the plot so it never covers a curve.
  std::size_t ylabel_chars = 1, name_chars = 0;
  for (const auto& t : ay.ticks) ylabel_chars = std::max(ylabel_chars, label_chars(t.label));
  for (const auto& s : series) name_chars = std::max(name_chars, label_chars(s.name));
  const auto max_name_chars = static_cast<std::size_t>(width * 0.3 / kCharWidth);
  name_chars = std::min(name_chars, max_name_chars);
  const double legend_w = series.empty() ? 0.0 : 36.0 + kCharWidth * double(name_chars);
  const double left = 34.0 + kCharWidth * double(ylabel_chars);
  const double right = width - 16.0 - legend_w;
  const double top = opts.title.empty() ? 16.0 : 40.0;
  const double bottom = height - (opts.x_label.empty() ? 30.0 : 48.0);
  auto px = [&](double x) { return left + ax.fraction(x) * (right - left); };
  auto py = [&](double y) { return bottom - ay.fraction(y) * (bottom - top); };

  std::string out;
  out += fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(role="img" aria-label="{2}" font-family="Helvetica, Arial, sans-serif" font-size="12">)"
      "\n",
      width, height, xml_escape(opts.title.empty() ? "chart" : opts.title));
  out += fmt::format(R"(<rect width="{}" height="{}" fill="#ffffff"/>)"
                     "\n",
                     width, height);
  if (!opts.title.empty())
    out += fmt::format(
        R"(<text x="{:.1f}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>)"
        "\n",
        (left + right) / 2, xml_escape(opts.title));

  // Grid lines and ticks: majors solid grey, log minors fainter.
  out += "<g class=\"grid\">\n";
  for (const auto& t : ax.ticks) {
    const double x = px(t.value);
    out += fmt::format(
        R"(<line x1="{0:.2f}" y1="{1:.2f}" x2="{0:.2f}" y2="{2:.2f}" stroke="{3}" stroke-width="1"/>)"
        "\n",
        x, top, bottom, t.major ? "#dddddd" : "#f0f0f0");
    out += fmt::format(
        R"(<line x1="{0:.2f}" y1="{1:.2f}" x2="{0:.2f}" y2="{2:.2f}" stroke="#333333"/>)"
        "\n",
        x, bottom, bottom + (t.major ? 5.0 : 3.0));
    if (!t.label.empty())
      out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" text-anchor="middle">{}</text>)"
                         "\n",
                         x, bottom + 18.0, t.label);
  }
  for (const auto& t : ay.ticks) {
    const double y = py(t.value);
    out += fmt::format(
        R"(<line x1="{0:.2f}" y1="{1:.2f}" x2="{2:.2f}" y2="{1:.2f}" stroke="{3}" stroke-width="1"/>)"
        "\n",
        left, y, right, t.major ? "#dddddd" : "#f0f0f0");
    out += fmt::format(R"(<line x1="{:.2f}" y1="{:.2f}" x2="{:.2f}" y2="{:.2f}" stroke="#333333"/>)"
                       "\n",
                       left - (t.major ? 5.0 : 3.0), y, left, y);
    if (!t.label.empty())
      out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" text-anchor="end">{}</text>)"
                         "\n",
                         left - 8.0, y + 4.0, t.label);
  }
  out += "</g>\n";
  out += fmt::format(
      R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="none" stroke="#333333"/>)"
      "\n",
      left, top, right - left, bottom - top);
  if (!opts.x_label.empty())
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" text-anchor="middle">{}</text>)"
                       "\n",
                       (left + right) / 2, height - 10.0, xml_escape(opts.x_label));
  if (!opts.y_label.empty())
    out += fmt::format(
        R"svg(<text transform="translate(14 {:.2f}) rotate(-90)" text-anchor="middle">{}</text>)svg"
        "\n",
        (top + bottom) / 2, xml_escape(opts.y_label));
  if (!any)
    out += fmt::format(
        R"(<text x="{:.2f}" y="{:.2f}" text-anchor="middle" fill="#777777">no data</text>)"
        "\n",
        (left + right) / 2, (top + bottom) / 2);

  // Curves, then the legend.
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = kPalette[s % kPaletteSize];
    const char* dash = kDashes[(s / kPaletteSize) % kDashCount];
    const std::string dash_attr =
        *dash != '\0' ? fmt::format(R"( stroke-dasharray="{}")", dash) : std::string();
    std::string pts;
    for (const auto& [x, y] : points[s]) pts += fmt::format("{:.2f},{:.2f} ", px(x), py(y));
    if (!pts.empty()) pts.pop_back();
    out += fmt::format(R"(<polyline data-series="{}" fill="none" stroke="{}" stroke-width="1.8"{} )"
                       R"(stroke-linejoin="round" points="{}"/>)"
                       "\n",
                       xml_escape(series[s].name), colour, dash_attr, pts);
    if (points[s].size() <= static_cast<std::size_t>(kMaxMarkers))
      for (const auto& [x, y] : points[s])
        out += fmt::format(R"(<circle cx="{:.2f}" cy="{:.2f}" r="2.5" fill="{}"/>)"
                           "\n",
                           px(x), py(y), colour);
  }
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = kPalette[s % kPaletteSize];
    const char* dash = kDashes[(s / kPaletteSize) % kDashCount];
    const double lx = right + 12.0, ly = top + 10.0 + 18.0 * double(s);
    out += fmt::format(
        R"(<line x1="{:.2f}" y1="{:.2f}" x2="{:.2f}" y2="{:.2f}" stroke="{}" stroke-width="2.5"{}/>)"
        "\n",
        lx, ly, lx + 20.0, ly, colour,
        *dash != '\0' ? fmt::format(R"( stroke-dasharray="{}")", dash) : std::string());
    const std::string shown = truncate_name(series[s].name, max_name_chars);
    // A truncated name keeps the full one as a hover tooltip.
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}"><title>{}</title>{}</text>)"
                       "\n",
                       lx + 26.0, ly + 4.0, xml_escape(series[s].name), xml_escape(shown));
  }
  out += "</svg>\n";
  return out;
}

void write_svg_file(const std::string& path, const std::string& svg) {
  const std::string doc = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg;
  write_file_atomic(path, doc);
}

}  // namespace desloc::report
