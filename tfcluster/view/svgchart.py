"""Line charts as SVG text in pure Python: ticks on 1-2-5 steps (or a 1-2-5 log sequence), a
grid, one polyline per series, and a legend box in the corner the lines leave emptiest.

A picture costs milliseconds and nothing beyond the standard library (matplotlib cost every
run 1.4 CPU s, most of it importing itself).
"""
import math

# matplotlib's "tab10": ten colours told apart at a glance, familiar from its pictures.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
TICK_FONT, AXIS_FONT, TITLE_FONT = 11, 12, 13
CHAR_WIDTH = 0.62  # of the font size: a sans-serif's widest common advance, for text boxes
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 72, 24, 28, 44  # tick labels fit
MARKED_BELOW = 30  # a series with fewer points gets a dot on each
LEGEND_ROW = TICK_FONT + 5
MAX_INTERVALS = 7  # between ticks on a linear axis; on a log one, a power of ten at most 10


def escape(text):
    """TEXT for XML character data or a quoted attribute (html.escape: a cost of every launch's
    imports, for html.entities)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
        .replace('"', "&quot;")


def tick_label(value, step):
    """VALUE with as many decimals as STEP (the ticks' spacing; on a log axis the value itself)
    needs; powers of ten beyond 1e-4..1e6 as 2.5e7."""
    if abs(value) < abs(step) * 1e-6:
        return "0"  # not "-0.0" from 3 * 0.1 - 0.3
    if not 1e-4 <= abs(value) < 1e6:
        mantissa, exponent = ("%.2e" % value).split("e")
        return "%se%d" % (mantissa.rstrip("0").rstrip("."), int(exponent))
    return "%.*f" % (max(0, -math.floor(math.log10(abs(step)) + 1e-9)), value)


def _multiples(lo, hi, step):
    """The range of multiples of STEP from at or below LO to at or above HI."""
    return range(math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9) + 1)


def linear_ticks(lo, hi):
    """[(value, label)] at multiples of the smallest 1-2-5 step that spans LO..HI in at most
    MAX_INTERVALS, from at or below LO to at or above HI."""
    if hi - lo <= max(abs(lo), abs(hi)) * 1e-9:  # one value: a band around it
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    power = 10.0 ** math.floor(math.log10((hi - lo) / MAX_INTERVALS))
    step = next(m * power for m in (1, 2, 5, 10, 20)
                if len(_multiples(lo, hi, m * power)) <= MAX_INTERVALS + 1)
    return [(i * step, tick_label(i * step, step)) for i in _multiples(lo, hi, step)]


def log_ticks(lo, hi):
    """[(value, label)] from at or below LO to at or above HI (both > 0): powers of ten over
    more than three decades, else the sequence 1, 2, 5, 10, 20..."""
    low, high = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    if high - low > 3:
        step = math.ceil((high - low) / 10)
        values = [10.0 ** k for k in range(low, high + step, step)]
    else:
        sequence = [m * 10.0 ** k for k in range(low, high + 1) for m in (1, 2, 5)]
        first = max(v for v in sequence if v <= lo * (1 + 1e-9))
        last = min(v for v in sequence if v >= hi * (1 - 1e-9))
        values = [v for v in sequence if first <= v <= last]
    return [(v, tick_label(v, v)) for v in values]


class Scale:
    """Data values onto pixels: TICKS' first value at START, their last at END."""

    def __init__(self, ticks, start, end, log=False):
        self.log, self.start = log, start
        self.lo, hi = self._axis(ticks[0][0]), self._axis(ticks[-1][0])
        self.per_unit = (end - start) / (hi - self.lo)

    def _axis(self, value):
        return math.log10(value) if self.log else value

    def __call__(self, value):
        return self.pixels([value])[0]

    def pixels(self, values):
        start, lo, per_unit = self.start, self.lo, self.per_unit
        return [start + (v - lo) * per_unit for v in (map(math.log10, values) if self.log
                                                     else values)]


def axis_ticks(lo, hi, log_y, room=0.0):
    """Ticks over LO..HI that leave the top ROOM share of the axis free above HI."""
    ticks = log_ticks(lo, hi) if log_y else linear_ticks(lo, hi)
    if room:
        bottom = ticks[0][0]
        hi = bottom * (hi / bottom) ** (1 / (1 - room)) if log_y \
            else bottom + (hi - bottom) / (1 - room)
        ticks = log_ticks(lo, hi) if log_y else linear_ticks(lo, hi)
    return ticks


def text(x, y, content, size, anchor="middle", extra=""):
    return '<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s"%s>%s</text>' % (
        x, y, size, anchor, extra, escape(content))


def text_width(content, size):
    return len(content) * size * CHAR_WIDTH


class Area:
    """The plotting rectangle of a panel whose box is (X, Y, WIDTH, HEIGHT)."""

    def __init__(self, x, y, width, height):
        self.left, self.right = x + MARGIN_LEFT, x + width - MARGIN_RIGHT
        self.top, self.bottom = y + MARGIN_TOP, y + height - MARGIN_BOTTOM
        self.middle = (self.left + self.right) / 2


def panel(box, titles, series, log_y=False):
    """The SVG of one panel in BOX (x, y, width, height): TITLES (panel, x axis, y axis) and
    SERIES [(label, colour, [(x, y)...])], on a log y axis with LOG_Y."""
    area = Area(*box)
    title, x_title, y_title = titles
    parts = ['<g class="panel">', text(area.middle, area.top - 9, title, TITLE_FONT,
                                       extra=' font-weight="bold"')]
    centre_y = (area.top + area.bottom) / 2
    parts.append(text(area.middle, area.bottom + 36, x_title, AXIS_FONT))
    parts.append(text(area.left - 56, centre_y, y_title, AXIS_FONT,
                      extra=' transform="rotate(-90 %.1f %.1f)"' % (area.left - 56, centre_y)))
    if series:
        parts += _plot(area, series, log_y)
    else:
        parts.append(text(area.middle, centre_y, "no points", AXIS_FONT, extra=' fill="#888"'))
    parts.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>'
                 % (area.left, area.top, area.right - area.left, area.bottom - area.top))
    parts.append("</g>")
    return "\n".join(parts)


def _plot(area, series, log_y):
    """Grid, ticks, one polyline (and dots when short) per series, and the legend."""
    xs = [x for _, _, points in series for x, _ in points]
    x_ticks = linear_ticks(min(xs), max(xs))
    to_x = Scale(x_ticks, area.left, area.right)
    most = int((area.right - area.left - 46) / (TICK_FONT * CHAR_WIDTH))
    entries = [(shortened(label, most), colour) for label, colour, _ in series]
    size = legend_size(entries)
    y_ticks, to_y, lines, corner = _fit_legend(area, series, to_x, log_y, size)
    parts = _grid(area, [to_x(v) for v, _ in x_ticks], [to_y(v) for v, _ in y_ticks])
    parts += [text(to_x(v), area.bottom + 16, label, TICK_FONT) for v, label in x_ticks]
    parts += [text(area.left - 6, to_y(v) + 4, label, TICK_FONT, "end") for v, label in y_ticks]
    for (label, colour, _), pixels in zip(series, lines):
        parts += _line(label, colour, pixels)
    parts.append(legend(corner, size, entries))
    return parts


def _fit_legend(area, series, to_x, log_y, size):
    """(y ticks, y scale, each series' pixels, the legend's corner): a corner the lines leave
    free; where none is, the y axis grows to make room above them, then the emptiest one."""
    ys = [y for _, _, points in series for _, y in points]
    share = min(0.3, (size[1] + 12) / (area.bottom - area.top))
    for room in (0.0, share, 2 * share):
        ticks = axis_ticks(min(ys), max(ys), log_y, room)
        to_y = Scale(ticks, area.bottom, area.top, log=log_y)
        lines = [list(zip(to_x.pixels([x for x, _ in points]),
                          to_y.pixels([y for _, y in points]))) for _, _, points in series]
        drawn = segments(lines)
        corner = next((c for c in corners(area, size) if not any(crossing(c, size, drawn))), None)
        if corner:
            return ticks, to_y, lines, corner
    return ticks, to_y, lines, min(corners(area, size),
                                   key=lambda c: sum(1 for _ in crossing(c, size, drawn)))


def _grid(area, xs, ys):
    lines = ['<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>' % (x, area.top, x, area.bottom)
             for x in xs]
    lines += ['<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>' % (area.left, y, area.right, y)
              for y in ys]
    return ['<g class="grid" stroke="#e5e5e5">'] + lines + ["</g>"]


def _line(label, colour, pixels):
    """A polyline titled LABEL (a browser shows it on hover), with a dot per point when short."""
    coordinates = " ".join("%.1f,%.1f" % pixel for pixel in pixels)
    parts = ['<polyline class="series" points="%s" fill="none" stroke="%s" stroke-width="1.6" '
             'stroke-linejoin="round"><title>%s</title></polyline>'
             % (coordinates, colour, escape(label))]
    if len(pixels) < MARKED_BELOW:
        parts.append('<g class="dots" fill="%s">%s</g>' % (colour, "".join(
            '<circle cx="%.1f" cy="%.1f" r="2.6"/>' % pixel for pixel in pixels)))
    return parts


def shortened(label, most):
    """LABEL in MOST characters at most: the legend stays inside its panel (the line's title,
    shown on hover, keeps it whole)."""
    return label if len(label) <= most else label[:most - 1] + "\u2026"


def legend_size(entries):
    """(width, height) of the legend of ENTRIES [(label, colour)]."""
    return (34 + max(text_width(label, TICK_FONT) for label, _ in entries),
            8 + LEGEND_ROW * len(entries))


def legend(corner, size, entries):
    """A box of SIZE at CORNER (left, top): a line of each colour and its label."""
    (left, top), (width, height) = corner, size
    parts = ['<g class="legend">', '<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="3" '
             'fill="white" fill-opacity="0.88" stroke="#bbb"/>' % (left, top, width, height)]
    for n, (label, colour) in enumerate(entries):
        y = top + 4 + LEGEND_ROW * (n + 0.5)
        parts.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" '
                     'stroke-width="2.5"/>' % (left + 6, y, left + 24, y, colour))
        parts.append(text(left + 29, y + 4, label, TICK_FONT, "start"))
    parts.append("</g>")
    return "\n".join(parts)


def corners(area, size):
    """Where a box of SIZE fits in AREA's corners: top right first, where falling curves leave
    room."""
    width, height = size
    right, bottom = area.right - width - 6, area.bottom - height - 6
    return [(right, area.top + 6), (area.left + 6, area.top + 6),
            (right, bottom), (area.left + 6, bottom)]


def crossing(corner, size, segments):
    """The SEGMENTS [(x0, y0, x1, y1)] that cross the box of SIZE at CORNER (left, top), lazily."""
    (left, top), (width, height) = corner, size
    right, bottom = left + width, top + height
    for x0, y0, x1, y1 in segments:
        if not ((x0 < left and x1 < left) or (x0 > right and x1 > right)
                or (y0 < top and y1 < top) or (y0 > bottom and y1 > bottom)) \
                and _clipped(left, top, right, bottom, x0, y0, x1 - x0, y1 - y0):
            yield x0, y0, x1, y1


def _clipped(left, top, right, bottom, x, y, dx, dy):
    """Whether the segment from (X, Y) by (DX, DY) has a part inside the box (Liang-Barsky)."""
    start, end = 0.0, 1.0
    for p, q in ((-dx, x - left), (dx, right - x), (-dy, y - top), (dy, bottom - y)):
        if p == 0:
            if q < 0:
                return False
        elif p < 0:
            start = max(start, q / p)
        else:
            end = min(end, q / p)
        if start > end:
            return False
    return True


def segments(lines):
    """The segments (x0, y0, x1, y1) of LINES; a line of one point is one of length 0."""
    return [(a, b, c, d) for pixels in lines
            for (a, b), (c, d) in zip(pixels, pixels[1:] or pixels)]


def document(width, height, title, panels):
    """A whole SVG file: TITLE over PANELS (from panel()) on white."""
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
        'font-family="%s" fill="#222">' % (width, height, width, height, FONT),
        '<rect width="%d" height="%d" fill="white"/>' % (width, height),
        text(width / 2, 24, title, 16, extra=' font-weight="bold"'),
        *panels, "</svg>", ""])
