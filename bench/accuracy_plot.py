#!/usr/bin/env python3
"""Predicted against measured time, per topology, as a self-contained SVG scatter on log axes:
the y = x line, a +-10% band, one colour per kind of prediction (planner all-reduce time,
simulator job time).

usage: bench/accuracy_plot.py docs/accuracy.csv docs/img/predicted_vs_measured.svg
CSV columns: kind,label,predicted_s,measured_s
"""
import csv
import math
import sys

COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00"]


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    vals = [float(r[k]) for r in rows for k in ("predicted_s", "measured_s")]
    lo = 10 ** math.floor(math.log10(min(vals)))
    hi = 10 ** math.ceil(math.log10(max(vals)))
    W, H, L, T, R, B = 720, 560, 80, 50, 30, 70
    pw, ph = W - L - R, H - T - B

    def x(v):
        return L + pw * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    def y(v):
        return T + ph - ph * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="15">'
           'desloc plan / simulate: predicted against measured time</text>']
    # +-10% band and y = x.
    band = [(lo, lo * 1.1), (hi, hi * 1.1), (hi, hi / 1.1), (lo, lo / 1.1)]
    out.append('<polygon fill="#eee" points="' +
               " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in band) + '"/>')
    out.append(f'<line x1="{x(lo):.1f}" y1="{y(lo):.1f}" x2="{x(hi):.1f}" y2="{y(hi):.1f}" '
               'stroke="#888" stroke-dasharray="4 3"/>')
    d = lo
    while d <= hi * 1.0001:
        out.append(f'<line x1="{x(d):.1f}" y1="{T + ph}" x2="{x(d):.1f}" y2="{T + ph + 5}" stroke="#333"/>'
                   f'<text x="{x(d):.1f}" y="{T + ph + 18}" text-anchor="middle">{d:g} s</text>'
                   f'<line x1="{L - 5}" y1="{y(d):.1f}" x2="{L}" y2="{y(d):.1f}" stroke="#333"/>'
                   f'<text x="{L - 8}" y="{y(d) + 4:.1f}" text-anchor="end">{d:g} s</text>')
        d *= 10
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 30}" text-anchor="middle">measured</text>')
    out.append(f'<text x="20" y="{T + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 20 {T + ph / 2})">predicted</text>')
    for i, k in enumerate(kinds):
        c = COLOURS[i % len(COLOURS)]
        for r in rows:
            if r["kind"] != k:
                continue
            m, p = float(r["measured_s"]), float(r["predicted_s"])
            out.append(f'<circle cx="{x(m):.1f}" cy="{y(p):.1f}" r="5" fill="{c}">'
                       f'<title>{r["label"]}: predicted {p:g} s, measured {m:g} s '
                       f'({100 * (p / m - 1):+.1f}%)</title></circle>')
        out.append(f'<circle cx="{L + 20}" cy="{T + 20 + 18 * i}" r="5" fill="{c}"/>'
                   f'<text x="{L + 32}" y="{T + 24 + 18 * i}">{k}</text>')
    out.append(f'<text x="{L + 20}" y="{T + 24 + 18 * len(kinds)}" fill="#666">'
               'grey band: within 10%</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("".join(out))


if __name__ == "__main__":
    main()
