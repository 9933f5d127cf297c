"""The report opened in a real headless Chromium: it parses, shows its four figures and logs no
console message. Skipped where no `chromium` is installed (Debian: `apt-get install chromium`).

The folder is synthetic (a timeline of two runs with preemptions, a summary), so no model runs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from batchgen.engine.timeline import Timeline
from batchgen.io import write_json_atomic
from batchgen.job.timeline_file import TimelineFile
from batchgen.report import write_job_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


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


def test_report_renders_in_headless_chromium_without_console_messages(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    out = tmp_path / "out"
    out.mkdir()
    _synthetic_job(out)
    page = write_job_report(out).html
    shot = tmp_path / "shot.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True)
    assert dom.stdout.count("<img") == 4 and "<h2>Runs</h2>" in dom.stdout
    assert "CONSOLE" not in dom.stderr, dom.stderr
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1280,3000", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000
