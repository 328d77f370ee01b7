"""Checks of the installed packages and of the separate vLLM environment.

Why from metadata: preflight must stay fast, and importing speculators costs about 7 s;
so versions come from package metadata, and vLLM (which lives in its own environment) is
probed through that environment's interpreter, never imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3_pipeline.compat.vllm import EAGLE3_DRAFT_OPTIONS
from eagle3_pipeline.core.config import eagle3_options
from eagle3_pipeline.core.versions import installed_versions
from eagle3_pipeline.preflight.record import VllmReading
from eagle3_pipeline.preflight.result import Check
from eagle3_pipeline.preflight.view import PreflightInputs

if TYPE_CHECKING:
    from eagle3_pipeline.serving.env import VllmProbe

# Installed-version requirements checked from package metadata (pyproject.toml's ranges).
PACKAGES: dict[str, str] = {
    "torch": ">=2.9,<=2.14.1",
    "transformers": ">=5.0,<=5.19.0",
    "speculators": ">=0.9,<0.10",
    "vllm": ">=0.33,<0.34",
}


def package_versions() -> dict[str, str | None]:
    """Versions of the packages preflight checks (:data:`PACKAGES`)."""
    return installed_versions(PACKAGES)


def _version_in(version: str, spec: str) -> bool:
    """PEP 440 range check; True when ``packaging`` is missing or a version is unparsable
    (presence is still checked)."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return True
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


def check_packages(cfg: PreflightInputs, versions: dict[str, str | None]) -> Check:
    """Required: torch, transformers, speculators; vLLM only for ``extract.backend=vllm``."""
    problems: list[str] = []
    for name, spec in PACKAGES.items():
        have = versions.get(name)
        required = name != "vllm" or cfg.extract.backend == "vllm"
        if have is None:
            if required:
                problems.append(f"{name} is not installed: pip install '{name}{spec}'")
            continue
        if not _version_in(have, spec):
            problems.append(f"{name} {have} is installed, need {spec}: pip install '{name}{spec}'")
    reading = ", ".join(f"{k} {v or '-'}" for k, v in versions.items())
    return Check("packages", not problems, reading, problems)


def vllm_needed(cfg: PreflightInputs) -> bool:
    """Whether any stage of this run starts vLLM."""
    return bool(
        cfg.validate.vllm
        or cfg.extract.backend == "vllm"
        or cfg.extract.mode == "online"  # the train stage serves the target
        or (
            cfg.data.regenerate
            and cfg.data.regenerate_backend == "server"
            and cfg.data.server.start
        )
    )


def probe_vllm(cfg: PreflightInputs) -> VllmProbe:
    """The vLLM environment's own answer (a ``VllmProbe``); a missing one is a reading with
    ``error`` set, so it becomes a failed check rather than a crash."""
    from eagle3_pipeline.serving.env import VllmEnvError, VllmProbe, find_python, probe

    try:
        return probe(find_python(cfg.vllm.python))
    except VllmEnvError as exc:
        return VllmProbe(python=str(cfg.vllm.python), error=str(exc))


def vllm_reading(probe: VllmProbe) -> VllmReading:
    """What the record keeps of a ``VllmProbe``: its fields, and whether it is usable."""
    return VllmReading(
        python=probe.python,
        version=probe.version,
        cpu_build=probe.cpu_build,
        cli_version=probe.cli_version,
        import_s=probe.import_s,
        eagle3_options=None if probe.eagle3_options is None else list(probe.eagle3_options),
        error=probe.error,
        ok=probe.ok,
    )


def check_vllm(cfg: PreflightInputs, result: Any) -> Check:
    """The vLLM environment imports, the CLI answers, and it is the build this hardware
    needs (the CPU build on CPU profiles, a CUDA build on GPU profiles)."""
    if result.error:
        return Check(
            "vllm",
            False,
            "missing",
            [
                f"vLLM environment: {result.error}; install it with `eagle3-vllm-env install` "
                "(or set validate.vllm=false to skip vLLM)"
            ],
        )
    want_cpu = cfg.hardware.device == "cpu"
    reading = f"vllm {result.version} ({'CPU' if result.cpu_build else 'CUDA'} build)"
    if bool(result.cpu_build) != want_cpu:
        return Check(
            "vllm",
            False,
            reading,
            [
                f"vLLM environment {result.python}: {reading}, but hardware={cfg.hardware.name} "
                f"needs the {'CPU' if want_cpu else 'CUDA'} build "
                f"(`eagle3-vllm-env install --device {'cpu' if want_cpu else 'cuda'}`)"
            ],
        )
    # (an MLA draft is served from its plain config, which deepseek_eagle3 reads directly)
    options = eagle3_options(cfg.train.draft)
    wanted = [o for o in EAGLE3_DRAFT_OPTIONS if options[o]]
    if wanted and cfg.validate.vllm and cfg.train.draft.layer_type != "mla":
        read = result.eagle3_options
        missing = [o for o in wanted if read is not None and o not in read]
        if missing:
            return Check(
                "vllm",
                False,
                reading,
                [
                    f"train.draft.{missing[0]}=true: vLLM {result.version} does not read it from "
                    f"a speculators config (it reads {', '.join(read) or 'none'}), so the draft "
                    "would be served without it; set it false or install a vLLM that reads it"
                ],
            )
    return Check("vllm", True, reading)


def attention_queries(
    cfg: PreflightInputs, spec: Any, draft: Any
) -> list[tuple[str, dict[str, Any]]]:
    """What vLLM's attention will be asked to run in this pipeline: the target's (unless
    MLA, whose kernels vLLM picks by other rules) wherever vLLM serves it, and the draft's
    when validate serves the draft -- each in the dtype the validate engines use."""
    v = cfg.validate
    _device, dtype = cfg.validate_runtime()
    out: list[tuple[str, dict[str, Any]]] = []
    if spec.attention != "mla":
        out.append(
            (
                f"target {spec.name} head_dim={spec.head_dim}",
                {"head_size": spec.head_dim, "dtype": dtype, "num_heads": spec.num_attention_heads},
            )
        )
    if v.vllm and draft is not None and draft.mla is None:  # MLA: see mla_draft_problem
        out.append(
            (
                f"the draft's head_dim={draft.head_dim} (train.draft.head_dim)",
                {
                    "head_size": draft.head_dim,
                    "dtype": dtype,
                    "num_heads": draft.num_attention_heads,
                },
            )
        )
    return out


# vLLM's CPU MLA kernel (CPU_MLA, vLLM 0.32) takes one latent width only.
CPU_MLA_LATENT = 576


def mla_draft_problem(cfg: PreflightInputs, draft: Any) -> str | None:
    """What vLLM would refuse of an MLA draft when validate starts it: on the CPU build the
    draft's latent (kv_lora_rank + qk_rope_head_dim) must be the CPU_MLA kernel's."""
    if draft is None or draft.mla is None or not cfg.validate.vllm:
        return None
    device, _dtype = cfg.validate_runtime()
    latent = draft.mla.kv_lora_rank + draft.mla.qk_rope_head_dim
    if device == "cpu" and latent != CPU_MLA_LATENT:
        return (
            f"train.draft.layer_type=mla: the draft's latent kv_lora_rank + qk_rope_head_dim = "
            f"{latent} (the target's), but vLLM's CPU MLA kernel takes {CPU_MLA_LATENT} only; "
            "validate on a GPU (validate.device=cuda) or use train.draft.layer_type=llama"
        )
    return None


def check_vllm_attention(
    cfg: PreflightInputs,
    reading: Any,
    queries: list[tuple[str, dict[str, Any]]],
    answers: list[dict[str, Any]] | None,
) -> Check:
    """Refuse, before anything is spent, a head size or dtype the attention backend of the
    installed vLLM does not take: it would fail only when validate starts the engine."""
    if answers is None:
        return Check("vllm_attention", True, "not known (vLLM's selector could not be asked)")
    problems: list[str] = []
    seen: list[str] = []
    for (what, q), a in zip(queries, answers, strict=True):
        if a.get("error"):
            problems.append(
                f"{what}: vLLM {reading.version} selects no attention backend for it ({a['error']})"
            )
            continue
        seen.append(f"{what} -> {a['backend']}")
        if not a.get("head_size_ok"):
            problems.append(
                f"{what}: vLLM {reading.version}'s {a['backend']} attention supports head "
                f"sizes {', '.join(map(str, a.get('head_sizes') or []))} only, so the "
                "engine would refuse it after training; choose a target (or "
                "train.draft.head_dim) vLLM serves, or set validate.vllm=false"
            )
        elif not a.get("dtype_ok"):
            problems.append(
                f"{what}: vLLM {reading.version}'s {a['backend']} attention "
                f"does not take dtype {q['dtype']} (set validate.dtype)"
            )
    return Check("vllm_attention", not problems, "; ".join(seen) or "nothing to check", problems)
