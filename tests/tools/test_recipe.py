"""Recipe options: speculators' Muon split, the optimizer group's state, the EAGLE-3.1
switches in the schema and in the checkpoint vLLM reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3_pipeline.core.config import ConfigError, TrainConfig, load_config
from eagle3_pipeline.preflight.view import PreflightInputs

REPO = Path(__file__).resolve().parents[2]


class Tiny(torch.nn.Module):
    """A draft-like module: an embedding, two matrices, a norm-like vector."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(10, 4)
        self.fc = torch.nn.Linear(8, 4, bias=False)
        self.mlp = torch.nn.Linear(4, 4, bias=True)
        self.norm = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.fc(x)) * self.norm


def _loss(model: Tiny, x: torch.Tensor) -> torch.Tensor:
    return (model(x) - 1.0).pow(2).mean()


@pytest.mark.integration
def test_muon_puts_each_parameter_where_speculators_does_and_learns():
    from speculators.train.optimizers import split_named_params_for_muon

    from eagle3_pipeline.train.optim import build_optimizer

    torch.manual_seed(0)
    model = Tiny()
    t = TrainConfig(optimizer="muon", lr=1e-2, scheduler="none")
    opt, sched = build_optimizer(model, t, total_steps=20)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    theirs_muon, _ = split_named_params_for_muon(model)
    assert {id(p) for g in muon.param_groups for p in g["params"]} == {
        id(p) for _, p in theirs_muon
    }
    assert {id(p) for _, p in theirs_muon} == {id(model.fc.weight), id(model.mlp.weight)}
    x = torch.randn(16, 8)
    before = _loss(model, x).item()
    for _ in range(20):
        opt.zero_grad()
        _loss(model, x).backward()
        opt.step()
        sched.step()
    assert _loss(model, x).item() < before


@pytest.mark.integration
def test_optimizer_group_state_round_trip_resumes_identically():
    """Two copies: one steps 6 times; the other steps 3, saves, is rebuilt, restores and
    steps 3 more. Both end with the same weights (Muon's momentum and AdamW's moments)."""
    from eagle3_pipeline.train.optim import build_optimizer

    t = TrainConfig(optimizer="muon", lr=1e-2, scheduler="cosine", warmup_ratio=0.2)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))

    def run(model: Tiny, opt, sched, n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            _loss(model, x).backward()
            opt.step()
            sched.step()

    torch.manual_seed(0)
    a = Tiny()
    b = Tiny()
    b.load_state_dict(a.state_dict())
    run(a, *build_optimizer(a, t, 6), 6)
    opt_b, sched_b = build_optimizer(b, t, 6)
    run(b, opt_b, sched_b, 3)
    saved = (
        opt_b.state_dict(),
        sched_b.state_dict(),
        {k: v.clone() for k, v in b.state_dict().items()},
    )
    c = Tiny()
    c.load_state_dict(saved[2])
    opt_c, sched_c = build_optimizer(c, t, 6)
    opt_c.load_state_dict(saved[0])
    sched_c.load_state_dict(saved[1])
    run(c, opt_c, sched_c, 3)
    for k, v in a.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k
    adamw_only = build_optimizer(Tiny(), TrainConfig(optimizer="adamw"), 6)[0]
    with pytest.raises(ValueError, match="2 optimizers"):
        adamw_only.load_state_dict(saved[0])


def test_eagle31_switches_are_schema_keys_and_exclusive_ones_fail_at_compose():
    cfg = load_config(
        ["train.optimizer=muon", "train.draft.norm_before_fc=true", "train.draft.norm_output=true"],
        conf_dir=REPO / "conf",
    )
    assert cfg.train.optimizer == "muon" and cfg.train.draft.norm_before_fc
    with pytest.raises(ConfigError, match="norm_before_fc and train.draft.fc_norm"):
        load_config(
            ["train.draft.norm_before_fc=true", "train.draft.fc_norm=true"], conf_dir=REPO / "conf"
        )
    with pytest.raises(ConfigError, match="optimizer"):
        load_config(["train.optimizer=sgd"], conf_dir=REPO / "conf")


@pytest.mark.parametrize("sweep", ["[0,1,2]", "[1,4]"])
def test_k_sweep_outside_what_the_draft_was_trained_for_fails_at_compose(sweep):
    with pytest.raises(ConfigError, match=r"validate.k_sweep=.*outside 1..3"):
        load_config([f"validate.k_sweep={sweep}"], conf_dir=REPO / "conf")
    assert load_config(["validate.k_sweep=[1,2,3]"], conf_dir=REPO / "conf").validate.k_sweep


def test_k_sweep_reports_each_k_against_the_same_baseline_and_the_best():
    from eagle3_pipeline.serving.result import GenerationPass
    from eagle3_pipeline.validate.vllm import k_sweep_figures

    def run(
        tps: float, drafts: int, accepted: list[int], outputs: list[list[int]]
    ) -> GenerationPass:
        counters = {
            "drafts": drafts,
            "draft_tokens": drafts * len(accepted),
            "accepted": sum(accepted),
            "accepted_per_pos": accepted,
        }
        return GenerationPass(outputs, 3, 3 / tps, tps, counters)

    plain = GenerationPass([[1, 2, 3]], 3, 0.3, 10.0, {})
    out = k_sweep_figures(
        {
            1: run(14.0, 100, [60], [[1, 2, 3]]),
            2: run(16.0, 80, [60, 40], [[1, 2, 3]]),
            3: run(15.0, 70, [60, 40, 20], [[1, 2, 4]]),
        },
        plain,
    )
    rows, best = out
    assert [r.k for r in rows] == [1, 2, 3]
    assert [r.speedup for r in rows] == pytest.approx([1.4, 1.6, 1.5])
    assert rows[1].acceptance_length == pytest.approx(1 + 100 / 80)
    assert rows[1].per_position_rate == pytest.approx([0.75, 0.5])
    assert [r.lossless for r in rows] == [True, True, False]
    assert best is not None and best.k == 2 and best.speedup == pytest.approx(1.6)
    # the recommendation follows vLLM's tokens/s, not acceptance: K=3 accepts the most
    longest = max(rows, key=lambda r: r.acceptance_length or 0.0)
    assert longest.k == 3 and longest.k != best.k


def test_an_option_the_installed_vllm_does_not_read_is_refused_at_preflight():
    """vLLM drops a speculators option its config reader does not copy; preflight (before
    training) names the option and the vLLM version. The probe's answer is injected here;
    tests/compat/test_vllm_compat.py asks the real vLLM."""
    from eagle3_pipeline.preflight.software import check_vllm
    from eagle3_pipeline.serving.env import VllmProbe

    cfg = load_config(
        ["train.draft.norm_before_fc=true", "train.draft.norm_output=true"], conf_dir=REPO / "conf"
    )
    old = VllmProbe(
        python="py", version="0.30.0+cpu", cpu_build=True, eagle3_options=["norm_before_fc"]
    )
    check = check_vllm(PreflightInputs.from_config(cfg), old)
    assert not check.passed and len(check.problems) == 1
    assert check.problems[0].startswith("train.draft.norm_output=true: vLLM 0.30.0+cpu")
    new = VllmProbe(
        python="py",
        version="0.32.0+cpu",
        cpu_build=True,
        eagle3_options=["norm_before_fc", "fc_norm", "norm_output"],
    )
    assert check_vllm(PreflightInputs.from_config(cfg), new).passed
    plain = load_config(
        ["train.draft.norm_before_fc=false", "train.draft.norm_output=false"],
        conf_dir=REPO / "conf",
    )
    assert check_vllm(PreflightInputs.from_config(plain), old).passed  # none asked
