"""The configuration: its schema, the rules across keys, and the one loader.

A package by job, so that a stage depends on what can change its results and nothing
else: :mod:`.schema` (every key once, with its default, bounds and doc), :mod:`.rules`
(checks across keys), :mod:`.compose` (Hydra composition and ``params.yaml``) and
:mod:`.cli` (a stage's command line) are code deps of every stage; :mod:`.wording` (how a
composition error reads) and :mod:`.help` (what ``--help`` and the key map say of a key)
are text for people, so rewording them reruns nothing. This module re-exports the first
four; import the text modules by name.
"""

from eagle3_pipeline.core.config.cli import config_from_cli, stage_argparser
from eagle3_pipeline.core.config.compose import (
    COMPOSING_HERE,
    DEFAULT_CONF_DIR,
    DEFAULT_PARAMS,
    check_composed,
    compose,
    compose_yaml,
    load_config,
    load_params,
)
from eagle3_pipeline.core.config.rules import check_tiny_architecture, validate
from eagle3_pipeline.core.config.schema import (
    SCHEMA_NAME,
    Config,
    DataConfig,
    DraftShapeConfig,
    ExtractConfig,
    GgufSourceConfig,
    HardwareConfig,
    ModelConfig,
    PathsConfig,
    PinnedFileConfig,
    PreflightConfig,
    RegenerateServerConfig,
    ServerConfig,
    ServingConfig,
    TargetStageConfig,
    ThroughputAssumptions,
    TinyModelConfig,
    TrainConfig,
    ValidateConfig,
    VllmConfig,
    built_here,
    describe,
    eagle3_options,
    norm_before_fc_on,
    register_schema,
    setting,
    validate_runtime,
)
from eagle3_pipeline.core.errors import ConfigError

__all__ = [
    "COMPOSING_HERE",
    "Config",
    "ConfigError",
    "DEFAULT_CONF_DIR",
    "DEFAULT_PARAMS",
    "DataConfig",
    "DraftShapeConfig",
    "ExtractConfig",
    "GgufSourceConfig",
    "HardwareConfig",
    "ModelConfig",
    "PathsConfig",
    "PinnedFileConfig",
    "PreflightConfig",
    "RegenerateServerConfig",
    "SCHEMA_NAME",
    "ServerConfig",
    "ServingConfig",
    "TargetStageConfig",
    "ThroughputAssumptions",
    "TinyModelConfig",
    "TrainConfig",
    "ValidateConfig",
    "VllmConfig",
    "built_here",
    "check_composed",
    "check_tiny_architecture",
    "compose",
    "compose_yaml",
    "config_from_cli",
    "describe",
    "eagle3_options",
    "load_config",
    "load_params",
    "norm_before_fc_on",
    "register_schema",
    "setting",
    "stage_argparser",
    "validate",
    "validate_runtime",
]
