"""The one loader every stage uses: ``conf/`` + overrides composed by Hydra, or a composed
``params.yaml``, merged into the schema and checked by the rules.

Why one loader: DVC runs stages against the composed ``params.yaml`` (``dvc repro`` never
composes ``conf/``), while a person runs ``python -m eagle3_pipeline.stages.X key=value``
and expects ``conf/`` + overrides. Both paths go through :func:`load_config` and are
validated by the same dataclass schema, so they cannot drift apart.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config.rules import validate
from eagle3_pipeline.core.config.schema import Config, register_schema
from eagle3_pipeline.core.config.wording import compose_error_line
from eagle3_pipeline.core.errors import ConfigError

# True while :func:`compose` runs Hydra: the errors are ours to word (ConfigError), not
# DVC's, even in a process that has imported DVC (compat.dvc's wrapper stands aside)
COMPOSING_HERE: ContextVar[bool] = ContextVar("eagle3_composing_here", default=False)
DEFAULT_PARAMS = "params.yaml"
DEFAULT_CONF_DIR = "conf"


def _to_config(node: Any) -> Config:
    """Merge an OmegaConf node / dict into the structured schema and validate it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        base = OmegaConf.structured(Config)
        merged = OmegaConf.merge(base, node)
        OmegaConf.resolve(merged)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(compose_error_line(exc)) from None
    assert isinstance(cfg, Config)
    return validate(cfg)


def check_composed(node: Any) -> None:
    """The schema's checks on a config Hydra composed (its ``hydra`` node, if kept, left
    out); raise :class:`ConfigError`. What the DVC hook runs before params.yaml is written."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig) and "hydra" in node:
        node = OmegaConf.masked_copy(node, [str(k) for k in node if k != "hydra"])
    _to_config(node)


def compose(overrides: list[str] | None = None, conf_dir: str | Path = DEFAULT_CONF_DIR) -> Any:
    """Compose ``conf/`` + Hydra overrides exactly like ``dvc exp run`` does.

    Returns the resolved OmegaConf node (what DVC dumps to params.yaml).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    conf_path = Path(conf_dir).resolve()
    if not (conf_path / "config.yaml").is_file():
        raise ConfigError(f"{conf_path / 'config.yaml'} not found: run from the repository root")
    register_schema()
    token = COMPOSING_HERE.set(True)
    try:
        with initialize_config_dir(str(conf_path), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(compose_error_line(exc)) from None
    finally:
        COMPOSING_HERE.reset(token)
    return cfg


def compose_yaml(
    overrides: list[str] | None = None, conf_dir: str | Path = DEFAULT_CONF_DIR
) -> str:
    """The text DVC writes to params.yaml for these overrides (``OmegaConf.to_yaml``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(compose(overrides, conf_dir))


def load_params(path: str | Path = DEFAULT_PARAMS) -> Config:
    """Load and validate a composed snapshot (what DVC-run stages read)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: params file not found (recompose it with `eagle3-compose`)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None
    try:
        return _to_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def load_config(
    overrides: list[str] | None = None,
    params: str | Path | None = None,
    conf_dir: str | Path = DEFAULT_CONF_DIR,
) -> Config:
    """The one loader: a params snapshot when given, else ``conf/`` + overrides."""
    if params is not None:
        if overrides:
            raise ConfigError(
                "overrides cannot be combined with --params: edit conf/ or pass overrides alone"
            )
        return load_params(params)
    return _to_config(compose(overrides, conf_dir))
