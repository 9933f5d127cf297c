"""The report opened in a real headless Chromium: it parses, each of its four figures decodes to
an image of the figure's size, and the browser logs no console message.

Chromium is required (CI installs the Debian package `chromium` in `.ci/install`): without it
the tests fail, unless BATCHGEN_NO_BROWSER=1 says to skip them. The figures are checked by a
probe: a copy of the page with a script in its head that turns any failed resource into a
console error and, once the page has loaded, writes into the DOM that ``--dump-dom`` prints
every image's decoded size and how many of its pixels are not opaque (a PNG cut short still
decodes at its full size, but leaves its missing rows transparent). The page itself holds no
script; the probe is the test's. The second test breaks a page (a corrupt or missing image, a
missing figure, a console message) and asserts the check then fails, on that very defect.

The folder is synthetic (a timeline of two runs with preemptions, a summary), so no model runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from batchgen.engine.timeline import Timeline
from batchgen.io import write_json_atomic
from batchgen.job.timeline_file import TimelineFile
from batchgen.report import write_job_report

pytestmark = pytest.mark.skipif(
    os.environ.get("BATCHGEN_NO_BROWSER") == "1", reason="BATCHGEN_NO_BROWSER=1: no browser test"
)

FIGURE_PX = (1000, 320)  # figures.py: 10 x 3.2 inches at 100 dpi
TITLES = ["Throughput over time", "Batch size and queue length", "KV pool use, preemptions marked",
          "Prefix-cache hit rate"]
_PROBE = """<script>
window.addEventListener("error", (e) => console.error("failed to load " + String(e.target.src).slice(0, 40)), true);
window.addEventListener("load", () => {
  // A PNG cut short still has its size (from its header); the rows it lacks stay transparent,
  // while a whole matplotlib figure is opaque everywhere: count the pixels that are not.
  const transparent = (img) => {
    if (!img.naturalWidth) return -1;
    const canvas = document.createElement("canvas");
    [canvas.width, canvas.height] = [img.naturalWidth, img.naturalHeight];
    const ctx = canvas.getContext("2d");
    ctx.drawImage(img, 0, 0);
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    let n = 0;
    for (let k = 3; k < data.length; k += 4) n += data[k] < 255 ? 1 : 0;
    return n;
  };
  const found = [...document.images].map((i) => [i.alt, i.naturalWidth, i.naturalHeight, transparent(i)]);
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(found);
  document.body.append(pre);
});
</script>"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `apt-get install chromium` (.ci/install does), "
                    "or set BATCHGEN_NO_BROWSER=1 to skip the browser test")
    return found


def _synthetic_job(out: Path) -> None:
    for run in range(2):
        timeline = Timeline(max_rows=64, kv_blocks_total=100)
        prefill = cached = preempt = 0
        for i in range(300):
            prefill += 40 if i % 20 == 0 else 0
            cached += 24 if i % 20 == 0 else 0
            preempt += 1 if i % 90 == 89 else 0
            timeline.record_step(
                t_start=1000.0 + run * 400 + i, t_end=1000.8 + run * 400 + i, num_scheduled_tokens=50,
                num_output_tokens=8, num_finished=1 if i % 10 == 0 else 0, num_running=8, num_waiting=30 - i // 10,
                prefill_tokens_total=prefill, cached_tokens_total=cached, preemptions_total=preempt,
                kv_blocks_used=60 + i % 40, kv_blocks_cached=20, kv_blocks_free=40 - i % 40,
            )
            timeline.record_rows(now=1000.9 + run * 400 + i, num_ok=1 if i % 10 == 0 else 0, num_error=0)
        TimelineFile(out, f"run-{run}", timeline, keep_previous=True).save()
    write_json_atomic(out / "summary.json", {"wall_s": 300.0, "preemptions": 3,
                                             "prefix_hit_rate": {"achieved": 0.37, "ideal": 0.5}})


@dataclass(frozen=True)
class Opened:
    images: list[tuple[str, int, int, int]]  # alt, width, height, pixels not opaque; page order
    console: list[str]  # the browser's console lines
    dom: str


def _common(chromium: str) -> list[str]:
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _open_probed(page: str, folder: Path, chromium: str) -> Opened:
    """Load a probed copy of `page` (HTML text) in Chromium."""
    probed = folder / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + _PROBE, 1), encoding="utf-8")
    dom = subprocess.run([*_common(chromium), "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True)
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert match is not None, f"the probe did not run: {dom.stdout[-500:]!r} {dom.stderr[-2000:]!r}"
    found = [(str(alt), int(w), int(h), int(n)) for alt, w, h, n in json.loads(match.group(1).replace("&quot;", '"'))]
    return Opened(found, _console(dom.stderr), dom.stdout)


def _check(opened: Opened) -> None:
    """What a good report shows: the four figures, in order, each decoded whole at the figure's
    size, the page's sections, and no console line."""
    assert opened.console == []
    assert [alt for alt, *_ in opened.images] == TITLES
    assert [(w, h, n) for _, w, h, n in opened.images] == [(*FIGURE_PX, 0)] * 4
    assert "<h2>Runs</h2>" in opened.dom and "<h2>Timeline</h2>" in opened.dom


def test_report_renders_in_headless_chromium_without_console_messages(tmp_path: Path) -> None:
    chromium = _chromium()
    out = tmp_path / "out"
    out.mkdir()
    _synthetic_job(out)
    page = write_job_report(out).html
    _check(_open_probed(page.read_text(encoding="utf-8"), tmp_path, chromium))
    # The page as written (no probe): no console line either, and it paints.
    shot = tmp_path / "shot.png"
    plain = subprocess.run([*_common(chromium), f"--screenshot={shot}", "--window-size=1280,3000", page.as_uri()],
                           capture_output=True, text=True, timeout=120, check=True)
    assert _console(plain.stderr) == []
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000


def _break(page: str, how: str) -> str:
    first = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert first is not None
    if how == "corrupt_image":  # the first figure's bytes cut short: an image that cannot decode
        return page.replace(first.group(1), first.group(1)[:200], 1)
    if how == "missing_image":  # its src points at a file that is not there
        return page.replace(first.group(0), 'src="figure-that-is-not-there.png"', 1)
    if how == "missing_figure":
        return re.sub(r"<figure>.*?</figure>", "", page, count=1, flags=re.S)
    assert how == "console_message"
    return page.replace("</body>", '<script>console.log("hello")</script></body>', 1)


@pytest.mark.parametrize("how", ["corrupt_image", "missing_image", "missing_figure", "console_message"])
def test_the_browser_check_fails_on_a_broken_page(tmp_path: Path, how: str) -> None:
    chromium = _chromium()
    out = tmp_path / "out"
    out.mkdir()
    _synthetic_job(out)
    page = write_job_report(out).html.read_text(encoding="utf-8")
    opened = _open_probed(_break(page, how), tmp_path, chromium)
    with pytest.raises(AssertionError):
        _check(opened)
    first = opened.images[0]
    if how == "corrupt_image":
        assert first[:3] == (TITLES[0], *FIGURE_PX) and first[3] > 0 and opened.console == []
    elif how == "missing_image":
        assert first == (TITLES[0], 0, 0, -1)
        assert len(opened.console) == 1 and "failed to load file:" in opened.console[0]
    elif how == "missing_figure":
        assert [alt for alt, *_ in opened.images] == TITLES[1:] and opened.console == []
    else:
        assert len(opened.console) == 1 and '"hello"' in opened.console[0]
