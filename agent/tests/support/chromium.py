"""Headless Chromium (Debian's ``chromium``) as the tests' browser: layout, a screenshot, its pixels.

Three passes, each a plain ``chromium --headless`` run (no driver, no network):

1. **layout**: a copy of the page with a measuring script appended; ``--dump-dom`` returns what the
   browser laid out: the page size, every chart's plot area, every drawn series (its box and colour),
   every legend entry, title and event label, every table, in page pixels;
2. **screenshot**: the whole page at its laid-out height (``--screenshot``) at device scale 2, so that
   a 1.5 px line covers at least two whole device pixels wherever layout puts it (at scale 1 a flat
   line at a fractional offset has no pixel of its own colour, only blends);
3. **pixels**: the screenshot decoded by Chromium itself into a canvas (the PNG is embedded as a
   data URL, so the canvas is not tainted), counting, inside each plot area, the pixels of each
   series' colour.

The page under test has no script of its own; the scripts here only measure it.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

WIDTH = 1100
#: device pixels per CSS pixel in the screenshot
SCALE = 2

_MEASURE = """
<script>
(() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height}; };
  const charts = [...document.querySelectorAll('svg[data-chart]')].map((svg) => ({
    kind: svg.dataset.chart,
    label: svg.getAttribute('aria-label'),
    box: box(svg),
    plot: svg.querySelector('.plotarea') ? box(svg.querySelector('.plotarea')) : null,
    titles: [...svg.querySelectorAll('text.t')].map(box),
    events: [...svg.querySelectorAll('text.ev')].map(box),
    legend: [...svg.querySelectorAll('.legend text')].map((t) => ({text: t.textContent, box: box(t)})),
    series: [...svg.querySelectorAll('.series')].map((s) => {
      const shape = s.matches('polyline, rect') ? s : s.querySelector('rect');
      const cs = shape ? getComputedStyle(shape) : null;
      const cells = [...s.querySelectorAll('rect')].map(box);  // a group's painted cells, not its label
      const union = cells.length ? cells.reduce((a, b) => {
        const x = Math.min(a.x, b.x), y = Math.min(a.y, b.y);
        return {x, y, w: Math.max(a.x + a.w, b.x + b.w) - x, h: Math.max(a.y + a.h, b.y + b.h) - y}; }) : box(s);
      return {label: s.dataset.series, tag: s.tagName, box: s.tagName === 'g' ? union : box(s),
              color: cs ? (s.tagName === 'polyline' ? cs.stroke : cs.fill) : null,
              points: s.getAttribute('points'), cells: s.querySelectorAll('rect').length};
    }),
  }));
  const tables = [...document.querySelectorAll('table')].map(box);
  const out = {page: {w: document.documentElement.scrollWidth, h: document.documentElement.scrollHeight},
               body: box(document.body), charts, tables};
  const pre = document.createElement('pre'); pre.id = 'gpulse-layout';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
})();
</script>
"""

_PIXELS = """<!DOCTYPE html><html><body><canvas id="c"></canvas><pre id="gpulse-pixels"></pre><script>
const jobs = %s;
const img = new Image();
img.onerror = () => { document.getElementById('gpulse-pixels').textContent = '{"error": "image did not decode"}'; };
img.onload = () => { try {
  const c = document.getElementById('c'); c.width = img.width; c.height = img.height;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const out = jobs.map((job) => {
    const x = Math.max(0, Math.round(job.x)), y = Math.max(0, Math.round(job.y));
    const w = Math.min(img.width - x, Math.round(job.w)), h = Math.min(img.height - y, Math.round(job.h));
    if (!(w > 0 && h > 0)) return {counts: job.colors.map(() => 0), background: 0, total: 0, empty: true};
    const d = g.getImageData(x, y, w, h).data;
    const counts = job.colors.map(() => 0);
    let background = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i] > 245 && d[i + 1] > 245 && d[i + 2] > 245) background++;
      job.colors.forEach((rgb, k) => {
        if (Math.abs(d[i] - rgb[0]) <= 6 && Math.abs(d[i + 1] - rgb[1]) <= 6 && Math.abs(d[i + 2] - rgb[2]) <= 6) counts[k]++;
      });
    }
    return {counts, background, total: w * h};
  });
  document.getElementById('gpulse-pixels').textContent = JSON.stringify(out);
  } catch (e) { document.getElementById('gpulse-pixels').textContent = JSON.stringify({error: String(e)}); }
};
img.src = "data:image/png;base64,%s";
</script></body></html>
"""


def chromium_path() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise RuntimeError("chromium not found: apt-get install -y chromium (the CI script does)")
    return exe


def _run(*args: str, timeout: float = 180, scale: int = 1) -> str:
    cmd = [
        chromium_path(),
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--hide-scrollbars",
        f"--force-device-scale-factor={scale}",
        "--no-first-run",
        "--disable-extensions",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"chromium failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


def _pre(dom: str, element_id: str) -> Any:
    m = re.search(rf'<pre id="{element_id}">(.*?)</pre>', dom, re.S)
    if not m or not m.group(1):
        raise RuntimeError(f"the measuring script left no result ({element_id}): {dom[:500]}")
    from html import unescape

    result = json.loads(unescape(m.group(1)))
    if isinstance(result, dict) and "error" in result:
        raise RuntimeError(f"the measuring script failed: {result['error']}")
    return result


def layout(page: Path, work: Path, width: int = WIDTH) -> dict[str, Any]:
    """Pass 1: what the browser laid out (see the module docstring)."""
    html = page.read_text(encoding="utf-8")
    measured = work / f"{page.stem}.measure.html"
    measured.write_text(html.replace("</body>", _MEASURE + "</body>", 1), encoding="utf-8")
    dom = _run(f"--window-size={width},1000", "--dump-dom", measured.as_uri())
    return _pre(dom, "gpulse-layout")


def screenshot(page: Path, out: Path, height: int, width: int = WIDTH) -> Path:
    """Pass 2: the whole page, ``width`` × ``height`` CSS pixels at :data:`SCALE` device pixels each."""
    _run(f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri(), scale=SCALE)
    return out


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def count_colors(png: Path, jobs: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """Pass 3: for each job ``{x, y, w, h, colors: [[r, g, b], ...]}`` (a rectangle in CSS pixels) the
    screenshot's pixels of each colour (±6 per channel) and of near-white background inside it, as
    the browser decoded them."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    jobs = [{**j, **{k: j[k] * SCALE for k in ("x", "y", "w", "h")}} for j in jobs]
    page = work / f"{png.stem}.pixels.html"
    page.write_text(_PIXELS % (json.dumps(jobs), data), encoding="utf-8")
    dom = _run("--window-size=400,300", "--virtual-time-budget=20000", "--dump-dom", page.as_uri(), timeout=300)
    return _pre(dom, "gpulse-pixels")


def rgb(css: str) -> list[int]:
    """``rgb(31, 119, 180)`` (a computed style) -> ``[31, 119, 180]``."""
    return [int(v) for v in re.findall(r"\d+", css)[:3]]
