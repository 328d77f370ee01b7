"""Helpers shared by the preflight / GPU / plan tests: in-memory GPUs and per-test configs."""

from __future__ import annotations

import copy
import functools
from dataclasses import fields
from pathlib import Path

from eagle3_pipeline.core.config import Config, load_config
from eagle3_pipeline.runtime.gpu import GpuInfo, GpuProcess

CONF = Path(__file__).resolve().parents[2] / "conf"
BLACKWELL = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def rtx(i: int, used: int = 0, procs: tuple[GpuProcess, ...] = (), **kw) -> GpuInfo:
    """RTX PRO 6000 Blackwell number ``i`` (97,887 MiB, cc 12.0), PCI bus order = index."""
    kw.setdefault("pci_bus_id", f"00000000:{0x18 + i:02X}:00.0")
    return GpuInfo(
        index=i,
        name=BLACKWELL,
        uuid=f"GPU-{i:02d}aa1b2c-0000-1111-2222-33334444{i:04d}",
        memory_total_mib=97887,
        memory_used_mib=used,
        compute_capability=(12, 0),
        processes=procs,
        **kw,
    )


@functools.cache
def _cfg(*overrides: str) -> Config:
    return load_config(list(overrides), conf_dir=CONF)


def cfg_for(tmp_path: Path, *overrides: str) -> Config:
    """The composed config with data/ and metrics/ under ``tmp_path``."""
    cfg = copy.deepcopy(_cfg(*overrides))
    return relocate(cfg, tmp_path)


def relocate(cfg: Config, root: Path) -> Config:
    """Point data_dir, metrics_dir and every artifact path under ``root`` (the paths are
    resolved from data_dir when the config is composed, so each is moved explicitly)."""
    old = cfg.data_dir
    cfg.data_dir = str(root / "data")
    cfg.metrics_dir = str(root / "metrics")
    for f in fields(cfg.paths):
        value = getattr(cfg.paths, f.name)
        if value == old or value.startswith(old + "/"):
            setattr(cfg.paths, f.name, cfg.data_dir + value[len(old) :])
        else:
            setattr(cfg.paths, f.name, str(root / value))
    return cfg
