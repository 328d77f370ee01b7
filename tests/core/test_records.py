"""The typed records between stages: each round-trips, a file of another schema version or
missing a key is refused in one line naming it and the command that rebuilds it, and what
a writer produces is what the plan, the train stage and the dvclive headline read."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import json
import textwrap
import tokenize
from pathlib import Path
from typing import Any

import pytest
from machines import cfg_for
from record_samples import (
    extract_record,
    gguf_conversion,
    gpu_reading,
    manifest,
    preflight_record,
    prepare_record,
    target_record,
    train_record,
    validate_record,
    validate_record_in_vllm,
)

import eagle3_pipeline
from eagle3_pipeline.core.metrics import (
    details_path,
    headline_path,
    read_details,
    write_stage_metrics,
)
from eagle3_pipeline.core.records import Record, RecordError
from eagle3_pipeline.data.record import PrepareRecord, Regeneration
from eagle3_pipeline.extract.manifest import check_manifest, manifest_count
from eagle3_pipeline.extract.record import ExtractManifest, ExtractPlan, ExtractRecord
from eagle3_pipeline.extract.view import ExtractInputs
from eagle3_pipeline.plan import resources, target_info
from eagle3_pipeline.preflight.record import (
    DiskReading,
    DiskUnknown,
    PreflightRecord,
    VllmReading,
)
from eagle3_pipeline.runtime.gpu import GpuMemory, GpuProcess, GpuSnapshot
from eagle3_pipeline.targets.record import TargetRecord
from eagle3_pipeline.train.record import TrainRecord
from eagle3_pipeline.train.view import TrainInputs
from eagle3_pipeline.validate.record import ValidateRecord

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "kimi_k25"
KIMI = (
    "model=kimi_k25",
    "hardware=rtx_pro_6000_x8",
    f"model.path={FIXTURE}",
    "data.source=hf",
    "data.path=org/chat-set",
    "train.samples=1000",
)

BUSY = GpuProcess(pid=8812, name="python", used_mib=41_210)
SAMPLES = {
    "preflight": preflight_record(),
    # a GPU run with every nested reading set: the visible GPU, the disk need, vLLM's probe
    "preflight_cuda": preflight_record(
        mode="cuda",
        hardware="h200_x1",
        driver_version="580.159.04",
        cuda_driver_version="13.0",
        no_driver=None,
        gpu_count_visible=1,
        gpus=[gpu_reading(memory_used_mib=41_210, processes=[BUSY])],
        disk=DiskReading(
            path="data",
            hidden_states_bytes=126_812_160,
            checkpoint_bytes=5_788_160,
            margin_bytes=1_000_000_000,
            need_bytes=1_132_600_320,
            free_bytes=70_558_887_936,
            upper_bound=True,
            fits=True,
            bytes_per_token=1024,
            total_tokens=122_880.0,
            basis="upper bound: data.max_seq_len=512 tokens per conversation",
        ),
        vllm=VllmReading(
            python="/venv/bin/python",
            version="0.33.0",
            cpu_build=False,
            cli_version="0.33.0",
            import_s=15.3,
            eagle3_options=["norm_before_fc"],
            error=None,
            ok=True,
        ),
        snapshot=GpuSnapshot(mode="cuda", gpus=[GpuMemory(0, "GPU-0", 41_210, [BUSY])]),
    ),
    "target": target_record(),
    "target_gguf": target_record(built=True, gguf=gguf_conversion()),
    "prepare": prepare_record(),
    "prepare_regenerated": prepare_record(
        regenerate=True,
        backend="hf",
        regeneration=Regeneration(
            requests=294,
            cached=0,
            generated_tokens=16_870,
            unfinished_turns=45,
            prompt_mismatch=0,
            failed_requests=0,
            wall_s=282.288,
        ),
    ),
    "extract": extract_record(),
    "manifest": manifest(),
    "train": train_record(),
    "validate": validate_record(),
    "validate_in_vllm": validate_record_in_vllm(),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_record_round_trips(name: str, tmp_path: Path) -> None:
    record = SAMPLES[name]
    path = tmp_path / f"{name}.json"
    record.write(path)
    data = json.loads(path.read_text())
    assert next(iter(data)) == "version" and data["version"] == record.schema_version() >= 1
    assert type(record).read(path) == record
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left


RECORDS = (
    PreflightRecord,
    TargetRecord,
    PrepareRecord,
    ExtractRecord,
    ExtractManifest,
    TrainRecord,
    ValidateRecord,
)


def _records_in_the_package() -> set[type[Record]]:
    """Every record a stage declares: the Record subclasses of the subpackages' record.py."""
    src = Path(eagle3_pipeline.__file__).parent
    for path in sorted(src.glob("*/record.py")):
        importlib.import_module(f"eagle3_pipeline.{path.parent.name}.record")
    return set(Record.__subclasses__())


def _nested_dataclasses(cls: type) -> set[type]:
    """The dataclasses a record's fields hold, at any depth (lists, dicts, unions)."""
    import typing

    seen: set[type] = set()

    def visit(tp: object) -> None:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if tp not in seen:
                seen.add(tp)
                for hint in typing.get_type_hints(tp).values():
                    visit(hint)
            return
        for arg in typing.get_args(tp):
            visit(arg)

    for hint in typing.get_type_hints(cls).values():
        visit(hint)
    return seen


def test_no_record_field_is_untyped() -> None:
    """Records all the way down: no field of a record, or of anything it holds, is ``Any``
    (a ``dict[str, Any]`` would let a reader index a key no writer declared)."""
    import typing

    classes = set(RECORDS).union(*(_nested_dataclasses(cls) for cls in RECORDS))
    untyped = [
        f"{cls.__qualname__}.{name}: {hint}"
        for cls in classes
        for name, hint in typing.get_type_hints(cls).items()
        if "Any" in str(hint) or "object" in str(hint)
    ]
    assert not untyped, untyped


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: getattr(c, "__qualname__", str(c)))
def test_pydantic_validates_every_record_and_requires_what_the_record_requires(
    cls: type[Record],
) -> None:
    """Records are read through pydantic over the same dataclasses: each one (and all it
    holds) is a type pydantic can validate, and its JSON schema requires exactly the keys
    the record refuses a file without -- one declaration, two readers that agree."""
    import pydantic

    schema = pydantic.TypeAdapter(cls).json_schema(mode="validation")
    assert set(schema.get("required", [])) == set(cls.required_keys())
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(cls)}


def test_every_nested_field_is_declared_with_its_comment() -> None:
    """The records' nested parts (the GPU snapshot, vLLM's figures, ...) are schema too:
    each field says what it is."""
    nested = set().union(*(_nested_dataclasses(cls) for cls in RECORDS)) - set(RECORDS)
    assert len(nested) > 10  # the walk reaches them
    for cls in sorted(nested, key=lambda c: c.__qualname__):
        own = [f for f in _declarations(cls)]
        uncommented = [name for name, comment in own if not comment]
        assert not uncommented, f"{cls.__qualname__}: fields without a comment: {uncommented}"


def _declarations(cls: type) -> list[tuple[str, str]]:
    """``(field, its comment)`` for each field the class body declares, in order. A
    field's comment is the one on its line, else the comment block right above the run of
    field lines it stands in (a heading over a group of fields); '' when it has none."""
    lines, _ = inspect.getsourcelines(cls)
    src = textwrap.dedent("".join(lines))
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    }
    text = src.splitlines()
    (node,) = ast.parse(src).body
    assert isinstance(node, ast.ClassDef)
    declared = [
        s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    ]
    field_lines = {n for s in declared for n in range(s.lineno, (s.end_lineno or s.lineno) + 1)}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    out = []
    for s in declared:
        assert isinstance(s.target, ast.Name)
        if s.target.id not in names:  # a ClassVar
            continue
        span = range(s.lineno, (s.end_lineno or s.lineno) + 1)
        comment = next((comments[n] for n in span if n in comments), "")
        above = s.lineno - 1
        while not comment and above in field_lines:
            above -= 1
        if not comment and above in comments and text[above - 1].lstrip().startswith("#"):
            comment = comments[above]
        out.append((s.target.id, comment))
    return out


def test_every_field_is_declared_once_with_its_comment() -> None:
    """The schema is the dataclass, each field declared once with what it is: a comment on
    its line or heading its group. A key a stage writes is one of its fields, and the ones
    a reader needs are required (no default to fall back on)."""
    assert _records_in_the_package() == set(RECORDS)  # a new record is checked here too
    ((name, comment),) = _declarations(Record)
    assert name == "version" and comment.startswith("schema version")
    for cls in RECORDS:
        declared = _declarations(cls)
        names = [name for name, _ in declared]
        # a name annotated twice in a class body is silently one field (the last one wins)
        assert len(names) == len(set(names)), (cls, sorted(n for n in names if names.count(n) > 1))
        # the file's keys: the version first (a subclass redeclares it only to bump it), then
        # the body's fields in their order
        own = [n for n in names if n != "version"]
        assert [f.name for f in dataclasses.fields(cls)] == ["version", *own], cls
        uncommented = [name for name, comment in declared if not comment]
        assert not uncommented, f"{cls.__name__}: fields without a comment: {uncommented}"
        assert cls.STAGE in ("preflight", "target", "prepare", "extract", "train", "validate")
    assert {"hardware", "target", "tokens_per_s"} <= set(TrainRecord.required_keys())
    assert {"hardware", "target", "tokens_per_s"} <= set(ExtractRecord.required_keys())
    assert {"rows", "conversations_train", "mean_tokens_per_row"} <= set(
        PrepareRecord.required_keys()
    )


def test_unset_optional_fields_stay_absent_from_the_file(tmp_path: Path) -> None:
    """Keys a run does not produce (no vLLM, no k_sweep, the hf backend's timings on vllm)
    are absent, as before the records, and read back as None."""
    path = tmp_path / "validate.json"
    validate_record().write(path)
    data = json.loads(path.read_text())
    assert "vllm_speedup" not in data and "vllm" not in data and "vllm_best_k" not in data
    assert ValidateRecord.read(path).vllm_speedup is None
    with_vllm = validate_record(vllm_speedup=2.5, vllm={"speedup": 2.5})
    with_vllm.write(path)
    assert json.loads(path.read_text())["vllm_speedup"] == 2.5


# --------------------------------------------------------------------------- refusals


def _one_line(exc: pytest.ExceptionInfo[RecordError], path: Path, stage: str) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    assert text.endswith(f"the {stage} stage rebuilds it: `dvc repro {stage}`"), text
    return text


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_another_version_is_one_line_naming_the_file_and_the_rebuild(
    name: str, tmp_path: Path
) -> None:
    record = SAMPLES[name]
    path = tmp_path / f"{name}.json"
    data = record.to_dict()
    other = record.schema_version() + 1
    path.write_text(json.dumps({**data, "version": other}))
    with pytest.raises(RecordError) as exc:
        type(record).read(path)
    text = _one_line(exc, path, record.STAGE)
    assert f"schema version {other}, this pipeline reads version {other - 1}" in text
    # written before records were versioned: refused, but for a record that reads such
    # files as a version (the manifest: its hidden states stay reusable)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "version"}))
    if type(record).UNVERSIONED_AS is not None:
        assert type(record).read(path) == record
        return
    with pytest.raises(RecordError) as exc:
        type(record).read(path)
    assert "no schema version" in _one_line(exc, path, record.STAGE)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_missing_key_is_one_line_naming_it(name: str, tmp_path: Path) -> None:
    record = SAMPLES[name]
    path = tmp_path / f"{name}.json"
    data = record.to_dict()
    gone = type(record).required_keys()[:2]
    path.write_text(json.dumps({k: v for k, v in data.items() if k not in gone}))
    with pytest.raises(RecordError) as exc:
        type(record).read(path)
    assert f"missing key(s) {', '.join(gone)}" in _one_line(exc, path, record.STAGE)


def test_absent_damaged_and_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "train.json"
    assert TrainRecord.read_if_present(path) is None
    with pytest.raises(RecordError) as exc:
        TrainRecord.read(path)
    assert "not found" in _one_line(exc, path, "train")
    path.write_text('{"version": 1, "val_loss"')  # half-written
    with pytest.raises(RecordError) as exc:
        TrainRecord.read_if_present(path)
    assert "not valid JSON" in _one_line(exc, path, "train")
    path.write_text("[1, 2]")
    with pytest.raises(RecordError) as exc:
        TrainRecord.read(path)
    assert "not a JSON object" in _one_line(exc, path, "train")


# --------------------------------------------------------------------------- writers -> readers


def test_stage_metrics_write_details_and_the_headline_the_plan_reads(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, *KIMI)
    prep = prepare_record(mean_tokens_per_row=2048.0, rows=500, conversations_train=250)
    write_stage_metrics(cfg, prep)
    assert read_details(cfg, PrepareRecord) == prep
    # the headline DVC shows: the record's headline fields, copied
    assert json.loads(headline_path(cfg, PrepareRecord).read_text()) == {"rows": 500}
    s = resources.estimate_storage(cfg, target_info.load_target(cfg.model))
    assert not s.upper_bound and s.basis.startswith("measured")
    assert s.mean_tokens_per_row == 2048.0 and s.rows_per_conversation == 2.0
    # train and validate: the headline is dvclive's summary, not a metrics/ file
    write_stage_metrics(cfg, train_record())
    assert details_path(cfg, "train").is_file()
    assert not (Path(cfg.metrics_dir) / "train.json").exists()
    with pytest.raises(ValueError, match="dvclive's summary"):  # train/live.py writes it
        headline_path(cfg, TrainRecord)


def test_the_plan_takes_measured_rates_from_its_own_profile_and_model(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, *KIMI)
    s = resources.estimate_storage(cfg, target_info.load_target(cfg.model))
    write_stage_metrics(
        cfg, extract_record(hardware=cfg.hardware.name, target=cfg.model.name, tokens_per_s=7000.0)
    )
    write_stage_metrics(
        cfg,
        train_record(
            hardware=cfg.hardware.name,
            target=cfg.model.name,
            tokens_per_s=2.0 * s.tokens_per_conversation,
        ),
    )
    ext, trn = resources.estimate_time(cfg, s)
    assert ext.rate == 7000.0 and ext.source.startswith("measured: tokens_per_s in")
    assert trn.rate == pytest.approx(2.0) and trn.source.startswith("measured")
    # another model's figures are not this one's
    write_stage_metrics(cfg, extract_record(hardware=cfg.hardware.name, target="other"))
    ext, _ = resources.estimate_time(cfg, s)
    assert ext.source.startswith("assumption")


def test_the_plan_says_why_it_ignores_a_record_it_cannot_read(tmp_path: Path) -> None:
    """Preflight runs the plan's estimate before the stage that rebuilds the file: an old
    file must not fail it, and the estimate names the file and the command."""
    cfg = cfg_for(tmp_path, *KIMI)
    path = details_path(cfg, "prepare")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"mean_tokens_per_row": 2048, "rows": 500}))  # unversioned
    s = resources.estimate_storage(cfg, target_info.load_target(cfg.model))
    assert s.upper_bound and s.mean_tokens_per_row is None
    assert f"{path}: no schema version" in s.basis and "`dvc repro prepare`" in s.basis


def test_the_train_stage_reads_preflights_snapshot(tmp_path: Path, caplog) -> None:
    from eagle3_pipeline.stages.train import preflight_snapshot

    cfg = cfg_for(tmp_path)
    assert preflight_snapshot(TrainInputs.from_config(cfg)) is None
    from eagle3_pipeline.runtime.gpu import GpuMemory, GpuProcess, GpuSnapshot

    snap = GpuSnapshot(
        mode="cuda", gpus=[GpuMemory(0, "GPU-0", 1, [GpuProcess(7, "python", None)])]
    )
    write_stage_metrics(cfg, preflight_record(mode="cuda", snapshot=snap))
    assert preflight_snapshot(TrainInputs.from_config(cfg)) == snap
    assert json.loads(headline_path(cfg, PreflightRecord).read_text()) == {"passed": True}
    details_path(cfg, "preflight").write_text(json.dumps({"snapshot": {"mode": "cuda"}}))
    assert preflight_snapshot(TrainInputs.from_config(cfg)) is None  # a warning, not a refused run
    assert "`dvc repro preflight`" in caplog.text


def test_the_manifest_the_extract_stage_writes_is_what_train_reads(tmp_path: Path) -> None:
    """extract.mode=online: the manifest built as the extract stage builds it (the engine
    it serves, its ``online_section`` of the config, ``write_manifest``), read back by the
    train stage's reader, starts the server the config asked for, with that engine."""
    from eagle3_pipeline.extract.manifest import manifest_key, write_manifest
    from eagle3_pipeline.extract.online import online_section
    from eagle3_pipeline.extract.rows import Rows
    from eagle3_pipeline.extract.vllm_backend import vllm_layer_ids
    from eagle3_pipeline.serving.engine import STAGING_PLACEHOLDER, build_engine
    from eagle3_pipeline.targets.adapter import describe_target
    from eagle3_pipeline.train.online import OnlineSource, _engine

    cfg = cfg_for(
        tmp_path,
        *KIMI,
        "extract.mode=online",
        "extract.dtype=float32",
        "extract.server.port=8123",
        "extract.server.concurrency=3",
        f"extract.staging_dir={tmp_path / 'staging'}",
        f"vllm.python={tmp_path / 'venv/bin/python'}",
        "vllm.startup_timeout_s=77",
        "vllm.shutdown_timeout_s=11",
    )
    spec = describe_target(FIXTURE, cfg.model)
    # what extract.online.record_online does once its checks passed
    engine = build_engine(cfg, spec, FIXTURE, "extract", staging=STAGING_PLACEHOLDER)
    key = manifest_key(spec, FIXTURE, cfg.extract.dtype, "vllm", "0" * 64, "float32")
    rows = Rows(path=tmp_path / "prepared", dataset=None, lengths=[100] * 8, sha256="0" * 64)
    out = tmp_path / "hidden_states"
    out.mkdir()
    write_manifest(
        out,
        key,
        rows,
        ExtractPlan(vllm_layer_ids=vllm_layer_ids(spec)),
        online=online_section(ExtractInputs.from_config(cfg), engine),
    )
    # what train.plan.plan_training does with it
    path = out / "manifest.json"
    read = ExtractManifest.read(path)
    assert read.is_online and read.backend == "vllm" and manifest_count(out) == 8
    source = OnlineSource.from_manifest(path, read)
    assert (source.port, source.concurrency, source.dtype) == (8123, 3, "float32")
    assert source.staging_dir == str(tmp_path / "staging")
    assert source.python == str(tmp_path / "venv/bin/python")
    assert (source.startup_timeout_s, source.shutdown_timeout_s) == (77.0, 11.0)
    assert source.log_file == str(Path(cfg.vllm.log_dir) / "vllm_online.log")
    # the engine train starts is the one extract built, with train's staging directory
    staging = tmp_path / "run-staging"
    started = _engine(source, staging)
    want = build_engine(cfg, spec, FIXTURE, "extract", staging=staging)
    assert started == want and started.serve_argv(8123) == want.serve_argv(8123)


def test_a_manifest_from_before_versions_keeps_its_hidden_states(tmp_path: Path) -> None:
    """Same keys, no ``version`` and (offline) no ``mode``: read as version 1, offline."""
    old = manifest(mode="offline").to_dict()
    del old["version"], old["mode"]
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    read = ExtractManifest.read(tmp_path / "manifest.json")
    assert read.version == 1 and read.mode == "offline" and not read.is_online
    assert manifest_count(tmp_path) == read.samples.count


def test_extract_never_reuses_files_under_a_manifest_it_cannot_read(tmp_path: Path) -> None:
    from eagle3_pipeline.core.errors import StageError

    key = {
        k: v
        for k, v in manifest().to_dict().items()
        if k
        in ("format", "backend", "target", "tokenizer_sha256", "layers", "hidden_size", "dtype")
    }
    old = manifest().to_dict()
    old["version"] = 7  # an extraction by a newer pipeline
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    (tmp_path / "hs_0.safetensors").write_bytes(b"x")
    assert manifest_count(tmp_path) == 0
    with pytest.raises(
        StageError,
        match=r"manifest.json: schema version 7.*"
        r"extract.on_mismatch=restart",
    ):
        check_manifest(tmp_path, key, None, "refuse")  # type: ignore[arg-type]
    assert check_manifest(tmp_path, key, None, "restart") == {}  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- the headline


def test_the_headline_keys_are_declared_once_on_the_records() -> None:
    from eagle3_pipeline.tools.experiments.compare import FIGURES

    assert PreflightRecord.headline_keys() == ("passed",)
    assert PrepareRecord.headline_keys() == ("rows",)
    assert TargetRecord.headline_keys() == () and ExtractRecord.headline_keys() == ()
    assert TrainRecord.headline_keys() == ("tokens_per_s",)
    assert set(ValidateRecord.headline_keys()) == {
        "acceptance_length",
        "vllm_speedup",
        "lossless",
        "vllm_best_k",
        "vllm_best_k_speedup",
        "acceptance_by_set",
        "acceptance_by_set_sampled",
        "vllm_speedup_by_concurrency",
        "vllm_break_even_concurrency",
    }
    # eagle3-compare reads the validate summary by these keys
    for _, file, keys in FIGURES:
        if file.startswith("validate/"):
            assert keys[0] in ValidateRecord.headline_keys(), keys
    # ... from dvclive's summary, where exactly the records whose headline goes there put it
    read_from_dvclive = {file.split("/")[0] for _, file, _ in FIGURES}
    assert {c.STAGE for c in RECORDS if c.HEADLINE_IN_DVCLIVE} == read_from_dvclive
    assert read_from_dvclive == {"train", "validate"}


def test_dvclive_summaries_are_the_records_headline(tmp_path: Path) -> None:
    import io

    from PIL import Image

    from eagle3_pipeline.train.live import write_summary
    from eagle3_pipeline.validate.live import write_live

    png = io.BytesIO()
    Image.new("RGB", (1, 1)).save(png, format="PNG")
    v = validate_record(
        vllm_speedup=2.5,
        vllm_best_k=3,
        vllm_best_k_speedup=2.7,
        acceptance_by_set={"mt_bench": 1.9, "humaneval": 2.2, "heldout": None},
        acceptance_by_set_sampled={"mt_bench": 1.7, "humaneval": 2.0},
        vllm_speedup_by_concurrency={"1": 2.5, "4": 1.4, "16": 0.9},
        vllm_break_even_concurrency=16,
    )
    summary = write_live(tmp_path / "validate", v, png.getvalue())
    assert summary == {
        "acceptance_length": 1.6,
        "lossless": True,
        "vllm_speedup": 2.5,
        "vllm_best_k": 3,
        "vllm_best_k_speedup": 2.7,
        "acceptance_by_set": {"mt_bench": 1.9, "humaneval": 2.2},  # a set without a figure: absent
        "acceptance_by_set_sampled": {"mt_bench": 1.7, "humaneval": 2.0},
        "vllm_speedup_by_concurrency": {"1": 2.5, "4": 1.4, "16": 0.9},
        "vllm_break_even_concurrency": 16,
    }
    points = json.loads(
        (tmp_path / "validate/plots/custom/acceptance_per_position.json").read_text()
    )
    assert [p["acceptance"] for p in points] == v.ours.per_position_rate
    summary = write_summary(tmp_path / "train", train_record(tokens_per_s=1234.5))
    assert summary["tokens_per_s"] == 1234.5


def test_portable_commands_name_workspace_files_relatively(tmp_path: Path) -> None:
    from eagle3_pipeline.core.portable import portable

    root = tmp_path / "ws"
    line = f'vllm serve {root}/data/target/model --x \'{{"model":"{root}/data/draft"}}\''
    assert portable(line, root) == 'vllm serve data/target/model --x \'{"model":"data/draft"}\''
    elsewhere = f"vllm serve {tmp_path}/other/model"  # outside the workspace: kept absolute
    assert portable(elsewhere, root) == elsewhere
    assert portable(f"{root}x/y", root) == f"{root}x/y"  # a sibling sharing the prefix
    assert portable("/a/b", "/") == "/a/b"


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("tokens_per_s", "fast", "key tokens_per_s: expected float, found str"),
        ("steps", 3.5, "key steps: expected int, found float"),
        ("steps", True, "key steps: expected int, found bool"),
        ("resumed", "no", "key resumed: expected bool, found str"),
        ("aux_layer_ids", [1, "2"], "key aux_layer_ids[1]: expected int, found str"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_file_and_key(
    tmp_path: Path, key: str, value: object, needle: str
) -> None:
    """A record read back is trusted by its reader: a wrong type fails where it is read,
    in one line naming the file, the key and the stage that rebuilds it."""
    record = SAMPLES["train"]
    path = tmp_path / "train.json"
    record.write(path)
    data = json.loads(path.read_text())
    assert key in data
    data[key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        TrainRecord.read(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {needle}") and "\n" not in msg
    assert "train" in msg  # the stage that rebuilds it


@pytest.mark.parametrize(
    ("name", "where", "value", "needle"),
    [
        (
            "preflight_cuda",
            ("gpus", 0, "processes", 0, "pid"),
            "8812",
            "key gpus[0].processes[0].pid: expected int, found str",
        ),
        ("preflight_cuda", ("gpus", 0, "mig_uuid"), 7, "key gpus[0].mig_uuid: expected str"),
        ("preflight_cuda", ("disk", "fits"), "yes", "key disk.fits: expected bool, found str"),
        (
            "preflight_cuda",
            ("vllm", "eagle3_options", 0),
            1,
            "key vllm.eagle3_options[0]: expected str, found int",
        ),
        (
            "preflight_cuda",
            ("cuda_driver_version",),
            13000,
            "key cuda_driver_version: expected str, found int",
        ),
        (
            "prepare_regenerated",
            ("regeneration", "requests"),
            2.5,
            "key regeneration.requests: expected int, found float",
        ),
    ],
)
def test_a_wrong_type_inside_a_nested_reading_is_refused_naming_the_dotted_key(
    tmp_path: Path, name: str, where: tuple[str | int, ...], value: object, needle: str
) -> None:
    """The nested readings are checked like the record's own fields: the message names the
    file and the dotted key down to the wrong value."""
    record = SAMPLES[name]
    path = tmp_path / f"{name}.json"
    data = record.to_dict()
    inner: Any = data
    for step in where[:-1]:
        inner = inner[step]
    assert where[-1] in inner or isinstance(where[-1], int)  # a key the file has
    inner[where[-1]] = value
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        type(record).read(path)
    assert _one_line(err, path, record.STAGE).startswith(f"{path}: {needle}")


def test_a_disk_that_cannot_be_estimated_reads_back_as_such(tmp_path: Path) -> None:
    """The disk field is one of two readings: the figures, or why there are none; a wrong
    type inside either is named at its own key, not as a mismatch of the whole union."""
    path = tmp_path / "preflight.json"
    record = preflight_record(disk=DiskUnknown(path="data", error="no config.json"))
    record.write(path)
    assert json.loads(path.read_text())["disk"] == {"path": "data", "error": "no config.json"}
    assert PreflightRecord.read(path) == record
    data = record.to_dict()
    data["disk"]["error"] = ["no config.json"]
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        PreflightRecord.read(path)
    assert "key disk.error: expected str, found list" in _one_line(err, path, "preflight")
    data["disk"] = {"path": "data"}  # neither reading
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        PreflightRecord.read(path)
    assert "key disk: expected DiskReading | DiskUnknown" in _one_line(err, path, "preflight")


@pytest.mark.parametrize(
    ("name", "keys", "value", "needle"),
    [
        (
            "train",
            ("data_parallel", 0, "rows_per_rank"),
            [10, "5"],
            "key data_parallel[0].rows_per_rank[1]: expected int, found str",
        ),
        (
            "train",
            ("draft_shape", "head_dim"),
            16.5,
            "key draft_shape.head_dim: expected int, found float",
        ),
        (
            "train",
            ("draft_shape", "mla"),
            {"q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": "128"},
            "key draft_shape.mla: missing qk_rope_head_dim, v_head_dim",
        ),
        (
            "target_gguf",
            ("gguf", "versions", "torch"),
            2.9,
            "key gguf.versions.torch: expected str, found float",
        ),
        (
            "target_gguf",
            ("gguf", "max_logit_diff"),
            "0",
            "key gguf.max_logit_diff: expected float, found str",
        ),
    ],
)
def test_a_wrong_type_inside_a_nested_record_is_refused_naming_the_dotted_key(
    tmp_path: Path, name: str, keys: tuple[str | int, ...], value: object, needle: str
) -> None:
    """The check goes all the way down: a figure inside a nested record (an epoch's
    sharding, the draft's shape, the GGUF conversion) is refused naming its dotted key."""
    record = SAMPLES[name]
    path = tmp_path / f"{name}.json"
    record.write(path)
    data = json.loads(path.read_text())
    inner = data
    for k in keys[:-1]:
        inner = inner[k]
    inner[keys[-1]] = value
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        type(record).read(path)
    assert needle in _one_line(err, path, record.STAGE)
    assert str(err.value).startswith(f"{path}: {needle}")


def test_an_int_figure_is_a_valid_float_and_enums_come_back_as_enums(tmp_path: Path) -> None:
    record = SAMPLES["train"]
    path = tmp_path / "train.json"
    record.write(path)
    data = json.loads(path.read_text())
    data["tokens_per_s"] = 100  # JSON has one number type: 100 is a float figure too
    path.write_text(json.dumps(data))
    assert TrainRecord.read(path).tokens_per_s == 100


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("vllm.concurrency.levels[1].speedup", "fast", "vllm.concurrency.levels[1].speedup"),
        ("sets.mt_bench.categories.math.ours.prompts", 1.5, "sets.mt_bench.categories.math"),
        ("vllm.workarounds.with_draft.env", ["x"], "vllm.workarounds.with_draft.env"),
        ("divergences", [{"prompt": "q0", "position": "3", "top2_margin": None}], "divergences"),
    ],
)
def test_a_wrong_type_deep_in_validates_figures_names_the_dotted_key(
    tmp_path: Path, key: str, value: object, needle: str
) -> None:
    """vLLM's figures, the sets and the divergences are typed all the way down: the report
    reads them as attributes, so a damaged leaf is refused where the file is read."""
    path = tmp_path / "validate.json"
    validate_record_in_vllm().write(path)
    data = json.loads(path.read_text())
    *parents, leaf = key.replace("[1]", ".1").split(".")
    node = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    assert leaf in node  # the sample has the field: the test damages a real key
    node[leaf] = value
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        ValidateRecord.read(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and needle in msg and "\n" not in msg, msg


def test_the_report_renders_from_the_record_it_reads_back(tmp_path: Path) -> None:
    """The report takes the typed record (and the facts beside it), so a record read back
    from validate.json renders the same report as the one the stage held."""
    from eagle3_pipeline.validate.facts import DataFacts, DraftFacts, ReportFacts, TargetFacts
    from eagle3_pipeline.validate.report import validation_files

    facts = ReportFacts(
        draft_dir="data/draft",
        target=TargetFacts("t (local: m)", "t", None, None, "DeepseekV3ForCausalLM", [1, 2]),
        data=DataFacts("sharegpt", None, "none declared", True, 1000),
        draft=DraftFacts({"model_type": "llama", "hidden_size": 128}, 512),
        serve_command="vllm serve m",
        findings=[],
        seed=0,
        versions={"speculators": "0.9.0"},
    )
    record = validate_record_in_vllm()
    path = tmp_path / "validate.json"
    record.write(path)
    held, read = validation_files(record, facts), validation_files(ValidateRecord.read(path), facts)
    assert held["report.md"] == read["report.md"] and held["README.md"] == read["README.md"]
    report = held["report.md"].decode()
    assert "| mt_bench, turn 2 |" in report and "| math |" in report and "## Under load" in report
    assert "## K" in report and "**K=2**" in report
    assert set(held) == {
        "report.md",
        "README.md",
        "acceptance.png",
        "acceptance_by_set.png",
        "speedup_by_concurrency.png",
    }
