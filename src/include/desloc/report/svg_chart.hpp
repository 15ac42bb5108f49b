// Self-contained SVG line charts (no scripts, no external fonts or styles) for run reports and
// bench plots: nice 1-2-5 ticks on linear axes, decades on log axes, a legend per series.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace desloc::report {

// One line on a chart; x[i] pairs with y[i] (extra elements of the longer vector are ignored).
struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct ChartOptions {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 720, height = 420;  // pixels of the <svg> viewport
};

// A self-contained <svg> element: axes with nice ticks (1-2-5 steps; decades on log axes),
// labels, title, a legend, one polyline per series in a distinct colour-blind-safe colour
// (Okabe-Ito; past eight series the colours repeat with a dash pattern). Non-finite points and
// (on log axes) non-positive values are skipped. Empty input draws the axes and "no data".
std::string svg_line_chart(const std::vector<Series>& series, const ChartOptions& opts);

// Writes a standalone .svg file atomically (XML prolog + the element); throws desloc::Error
// naming the path on failure.
void write_svg_file(const std::string& path, const std::string& svg);

// The stroke colour of series `index` (e.g. for a matching swatch in an HTML table).
std::string series_colour(std::size_t index);

// Escapes & < > " ' for XML (and HTML) text and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace desloc::report
