#!/usr/bin/env python3
"""Build .dvc/offline_plots.html: DVC's plots page template with vega, vega-lite and
vega-embed inlined, so `dvc plots show` / `dvc plots diff` render with no network.

Why: DVC's default page loads the three libraries from a CDN; on an offline machine (or a
GPU node without internet) the page stays blank. DVC reads `plots.html_template` from
.dvc/config; a template without the `{scripts}` placeholder keeps DVC's CDN tags out.

The three packages come from the npm registry (`npm pack`, no install), pinned below; all
three are BSD-3-Clause, and their licence texts are kept in the page. Run this to update
them; the result is committed (about 0.8 MB).

    python scripts/build_offline_plots_template.py            # npm pack into a temp dir
    python scripts/build_offline_plots_template.py --from DIR # use tarballs already in DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = {  # npm package -> (version, file in the tarball)
    "vega": ("5.33.1", "package/build/vega.min.js"),
    "vega-lite": ("5.23.0", "package/build/vega-lite.min.js"),
    "vega-embed": ("6.29.0", "package/build/vega-embed.min.js"),
}
OUT = Path(__file__).resolve().parents[1] / ".dvc" / "offline_plots.html"

PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>DVC Plot (offline)</title>
    <!-- {notice} -->
{scripts}
    <style>
        table {{ border-spacing: 15px; }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def _member(tgz: Path, name: str) -> str | None:
    with tarfile.open(tgz) as tar:
        try:
            f = tar.extractfile(name)
        except KeyError:
            return None
        return f.read().decode("utf-8") if f is not None else None


def _repository(meta: dict) -> str:
    repo = meta.get("repository")
    return str(repo.get("url") if isinstance(repo, dict) else repo or meta.get("homepage"))


def build(tarballs: Path) -> str:
    scripts, notice = [], []
    for pkg, (version, member) in PACKAGES.items():
        tgz = tarballs / f"{pkg}-{version}.tgz"
        if not tgz.is_file():
            raise SystemExit(f"{tgz} not found: run `npm pack {pkg}@{version}` in {tarballs}")
        js = _member(tgz, member)
        meta = json.loads(_member(tgz, "package/package.json") or "{}")
        if js is None or meta.get("license") != "BSD-3-Clause":
            raise SystemExit(f"{tgz}: no {member}, or not BSD-3-Clause ({meta.get('license')})")
        for placeholder in ("{plot_divs}", "{scripts}", "{refresh_tag}"):
            if placeholder in js:  # DVC fills placeholders by plain replacement
                raise SystemExit(f"{pkg}: contains {placeholder}; cannot be inlined")
        text = _member(tgz, "package/LICENSE") or (
            "(the npm tarball ships no LICENSE file; the text is in the package's repository, "
            f"{_repository(meta)})"
        )
        notice.append(f"{pkg} {version} (npm), BSD-3-Clause:\n{text.replace('--', '- -')}")
        scripts.append(f"    <script>/* {pkg} {version} */\n{js}\n    </script>")
    return PAGE.format(notice="\n".join(notice), scripts="\n".join(scripts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", type=Path, help="directory holding the tarballs")
    args = ap.parse_args(argv)
    if args.src:
        page = build(args.src)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            specs = [f"{p}@{v}" for p, (v, _) in PACKAGES.items()]
            subprocess.run(["npm", "pack", "--silent", *specs], cwd=tmp, check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            page = build(Path(tmp))
    OUT.write_text(page, encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
