"""`dvc plots show` renders with no network: the page DVC writes with the project's template
(.dvc/offline_plots.html, vega inlined) is drawn by a real headless Chromium, checked on
its screenshot. The same page with DVC's default template (vega from a CDN) stays blank
here, which shows the check can fail.

Chromium comes from Debian (`apt-get install chromium`, as .ci/run does); without it the
test is skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from commands import run_ok

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LINE = (148, 93, 214)  # the colour DVC gives the first revision's line, #945dd6

pytestmark = [
    pytest.mark.integration,  # runs `dvc plots show`
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed"),
]


def _project(root: Path, template: bool) -> Path:
    """A DVC project with one training curve in dvclive's layout (step, loss)."""
    root.mkdir()
    run_ok(root, "git", "init", "-q")
    run_ok(root, sys.executable, "-m", "dvc", "init", "-q")
    curve = root / "dvclive/train/plots/metrics/train/loss.tsv"
    curve.parent.mkdir(parents=True)
    curve.write_text("step\tloss\n" + "".join(f"{s}\t{8 / s:.4f}\n" for s in range(1, 41)))
    (root / "dvc.yaml").write_text("plots:\n  - dvclive/train/plots/metrics:\n      x: step\n")
    if template:
        shutil.copy(REPO / ".dvc/offline_plots.html", root / ".dvc/offline_plots.html")
        run_ok(
            root, sys.executable, "-m", "dvc", "config", "plots.html_template", "offline_plots.html"
        )
    return root


def _screenshot(page: Path, out: Path) -> list[tuple[int, int, int]]:
    from PIL import Image

    assert CHROMIUM is not None
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--proxy-server=127.0.0.1:9",  # no network, even where the machine has one
            "--window-size=900,700",
            "--virtual-time-budget=10000",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    image = Image.open(out).convert("RGB")
    flat = getattr(image, "get_flattened_data", image.getdata)  # Pillow 14 drops getdata
    return list(flat())


def _line(pixels: list[tuple[int, int, int]]) -> int:
    return sum(1 for p in pixels if all(abs(a - b) <= 30 for a, b in zip(p, LINE, strict=True)))


def test_the_project_template_renders_offline_and_the_cdn_one_does_not(tmp_path):
    offline = _project(tmp_path / "offline", template=True)
    run_ok(offline, sys.executable, "-m", "dvc", "plots", "show", "-o", "page")
    html = (offline / "page/index.html").read_text()
    assert "cdn.jsdelivr.net" not in html and "vega-embed 6.29.0" in html
    drawn = _screenshot(offline / "page/index.html", tmp_path / "offline.png")
    # the curve and its axes are drawn: hundreds of pixels of the line's colour
    assert _line(drawn) > 200, _line(drawn)
    assert sum(1 for p in drawn if p != (255, 255, 255)) > 2000

    online = _project(tmp_path / "online", template=False)
    run_ok(online, sys.executable, "-m", "dvc", "plots", "show", "-o", "page")
    assert "cdn.jsdelivr.net" in (online / "page/index.html").read_text()
    assert _line(_screenshot(online / "page/index.html", tmp_path / "online.png")) == 0


def test_the_repository_uses_the_offline_template():
    config = (REPO / ".dvc/config").read_text()
    assert "html_template = offline_plots.html" in config
    page = (REPO / ".dvc/offline_plots.html").read_text()
    assert "{plot_divs}" in page and "{scripts}" not in page  # no CDN tags from DVC
    for marker in ("vega 5.33.1", "vega-lite 5.23.0", "vega-embed 6.29.0", "BSD-3-Clause"):
        assert marker in page
