"""Bar, stacked-bar and column charts as inline SVG (no plotting library)."""
from __future__ import annotations
from ._style import _esc


def _svg(width: int, height: int, body: list[str], title: str = "") -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
            f'font-size="11">')
    t = (f'<text x="0" y="13" font-size="13" font-weight="bold" fill="#333">{_esc(title)}</text>'
         if title else "")
    return head + t + "".join(body) + "</svg>"


def bar_chart_svg(rows: list[tuple], title: str = "", width: int = 460,
                  label_width: int = 170) -> str:
    """Horizontal bars: ``rows`` of (label, value, colour, value text[, hover text])."""
    top = 22 if title else 4
    bar_h, gap = 16, 6
    height = top + len(rows) * (bar_h + gap) + 4
    vmax = max((r[1] for r in rows), default=0) or 1
    area = width - label_width - 110
    body = []
    for k, row in enumerate(rows):
        label, value, colour, text = row[:4]
        hover = row[4] if len(row) > 4 else f"{label}: {text}"
        y = top + k * (bar_h + gap)
        w = max(value / vmax * area, 1.5 if value else 0)
        body.append(f'<g><title>{_esc(hover)}</title>'
                    f'<text x="{label_width - 6}" y="{y + 12}" text-anchor="end" fill="#333">'
                    f'{_esc(label[:32])}</text>'
                    f'<rect x="{label_width}" y="{y}" width="{area}" height="{bar_h}" '
                    f'fill="#f4f6f7" rx="2"/>'
                    f'<rect x="{label_width}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                    f'fill="{colour}" rx="2"/>'
                    f'<text x="{label_width + w + 5:.1f}" y="{y + 12}" fill="#333">'
                    f'{_esc(text)}</text></g>')
    return _svg(width, height, body, title)


def stacked_bar_svg(parts: list[tuple], title: str = "", width: int = 460,
                    empty: str = "nothing yet") -> str:
    """One bar split into ``parts`` of (label, value, colour), with a legend."""
    top = 22 if title else 4
    total = sum(p[1] for p in parts)
    body = []
    x = 0.0
    if total <= 0:
        body.append(f'<rect x="0" y="{top}" width="{width}" height="22" fill="#f4f6f7" rx="3"/>'
                    f'<text x="8" y="{top + 15}" fill="#888">{_esc(empty)}</text>')
    for label, value, colour in parts:
        if total <= 0 or value <= 0:
            continue
        w = value / total * width
        body.append(f'<rect x="{x:.1f}" y="{top}" width="{w:.1f}" height="22" fill="{colour}">'
                    f'<title>{_esc(label)}: {value / total:.0%}</title></rect>')
        if w > 34:
            body.append(f'<text x="{x + w / 2:.1f}" y="{top + 15}" text-anchor="middle" '
                        f'fill="white" font-weight="bold">{value / total:.0%}</text>')
        x += w
    lx, ly = 0, top + 38
    for label, value, colour in parts:
        body.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
                    f'<text x="{lx + 14}" y="{ly}" fill="#333">{_esc(label)}</text>')
        lx += 22 + 6.5 * len(label)
    return _svg(width, ly + 6, body, title)


def column_chart_svg(columns: list[tuple], legend: list[tuple], title: str = "",
                     width: int = 460, height: int = 170) -> str:
    """Stacked columns: ``columns`` of (label, [(value, colour)], text above, hover text);
    ``legend`` of (label, colour)."""
    top = 22 if title else 4
    base = height - 34
    vmax = max((sum(v for v, _ in c[1]) for c in columns), default=0) or 1
    n = max(len(columns), 1)
    slot = width / n
    cw = min(34.0, slot * 0.7)
    body = [f'<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#bbb"/>']
    for k, (label, stack, text, hover) in enumerate(columns):
        x = k * slot + (slot - cw) / 2
        y = float(base)
        parts = [f"<g><title>{_esc(hover)}</title>"]
        for value, colour in stack:
            h = value / vmax * (base - top - 14)
            if h <= 0:
                continue
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw:.1f}" height="{h:.1f}" '
                         f'fill="{colour}"/>')
        parts.append(f'<text x="{x + cw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                     f'font-size="10" fill="#333">{_esc(text)}</text>')
        parts.append(f'<text x="{x + cw / 2:.1f}" y="{base + 13}" text-anchor="middle" '
                     f'font-size="10" fill="#555">{_esc(label)}</text></g>')
        body.append("".join(parts))
    if not columns:
        body.append(f'<text x="8" y="{base - 10}" fill="#888">no cells with xla work yet</text>')
    lx = 0
    for label, colour in legend:
        body.append(f'<rect x="{lx}" y="{height - 11}" width="10" height="10" fill="{colour}"/>'
                    f'<text x="{lx + 14}" y="{height - 2}" fill="#333">{_esc(label)}</text>')
        lx += 24 + 6.5 * len(label)
    return _svg(width, height, body, title)
