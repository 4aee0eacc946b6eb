"""Which code lines of the built docs site are clipped at the page edge, measured in Chromium.

    bash scripts/docs.sh && python scripts/docs_clipping.py [--width 1280]

Each page of ``docs/_build/html`` is opened in headless Chromium at a laptop's window width, with a script that
measures every ``<pre>`` block (its ``scrollWidth`` against its ``clientWidth``: a block wider than its box shows a
scroll bar and hides the end of its longest lines) and every table. Prints one line per
clipped block with its longest line, and the widest line (in characters) that fits; exits 1 if anything is
clipped. ``tests/test_docs.py`` holds the docs' code blocks to the width this measures, without a browser.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SITE = Path(__file__).resolve().parents[1] / "docs" / "_build" / "html"

SCRIPT = """<script>
window.addEventListener("load", () => {
  const found = [];
  let fits = 0;
  for (const pre of document.querySelectorAll("article pre")) {
    const longest = pre.innerText.split("\\n").reduce((a, b) => (b.length > a.length ? b : a), "");
    if (pre.scrollWidth > pre.clientWidth + 1) found.push({kind: "code", line: longest});
    else fits = Math.max(fits, longest.length);
  }
  for (const table of document.querySelectorAll("article table")) {
    const box = table.parentElement;
    if (box.scrollWidth > box.clientWidth + 1) found.push({kind: "table", line: table.innerText.split("\\n")[0]});
  }
  const out = document.createElement("pre");
  out.id = "clip-out";
  out.textContent = JSON.stringify({found, fits});
  document.body.appendChild(out);
});
</script>"""


def measure(page: Path, width: int, chromium: str) -> dict[str, object]:
    """``{"found": [...], "fits": N}`` for one built page (a copy of it with the script, beside it, removed after)."""
    probe = page.with_name(f"_clipping-{page.name}")
    probe.write_text(page.read_text().replace("</body>", SCRIPT + "</body>"))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    f"--user-data-dir={tmp}",
                    "--virtual-time-budget=15000",
                    f"--window-size={width},1000",
                    "--dump-dom",
                    probe.as_uri(),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
    finally:
        probe.unlink()
    m = re.search(r'<pre id="clip-out"[^>]*>(.*?)</pre>', out, re.S)
    if not m:
        raise RuntimeError(f"{page.name}: Chromium did not measure the page")
    result: dict[str, object] = json.loads(html.unescape(m.group(1)))
    return result


def main(argv: list[str] | None = None) -> int:
    """Measure every built page; print the clipped blocks; 0 if none, 1 if any, 2 without Chromium or a site."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1280, help="the window's width in CSS pixels (default 1280)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        print("docs_clipping: no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    if not (SITE / "index.html").exists():
        print("docs_clipping: build the site first: bash scripts/docs.sh", file=sys.stderr)
        return 2
    clipped, fits = 0, 0
    for page in sorted(SITE.glob("*.html")):
        if page.name in ("genindex.html", "search.html", "py-modindex.html"):
            continue
        result = measure(page.resolve(), args.width, chromium)
        fits = max(fits, int(result["fits"]))  # type: ignore[call-overload]
        for item in result["found"]:  # type: ignore[attr-defined]
            clipped += 1
            print(f"{page.name}: {item['kind']} clipped: {item['line'][:140]!r} ({len(item['line'])} characters)")
    print(f"{clipped} clipped block(s) at {args.width} px; the longest code line that fits: {fits} characters")
    return 1 if clipped else 0


if __name__ == "__main__":
    sys.exit(main())
