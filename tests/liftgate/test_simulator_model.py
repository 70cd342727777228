"""Seeded draws of the simulated model follow the configured distributions (pure logic)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from liftgate.simulator import load_models
from liftgate.simulator_model import ModelBehaviour, SimulatorModel


def test_latency_and_ttft_draws_have_the_configured_mean_and_sd() -> None:
    model = SimulatorModel(name="m", latency_ms=200, latency_sd=50, ttft_ms=40, ttft_sd=10, seed=1)
    behaviour = ModelBehaviour(model)
    draws = [behaviour.draw() for _ in range(20_000)]
    latency = [d.latency_s * 1000 for d in draws]
    ttft = [d.ttft_s * 1000 for d in draws]
    assert statistics.fmean(latency) == pytest.approx(200, rel=0.03)
    assert statistics.stdev(latency) == pytest.approx(50, rel=0.08)
    assert statistics.fmean(ttft) == pytest.approx(40, rel=0.03)
    assert statistics.stdev(ttft) == pytest.approx(10, rel=0.08)
    assert all(d.latency_s >= d.ttft_s for d in draws)


def test_response_length_over_many_prompts_has_the_configured_mean() -> None:
    behaviour = ModelBehaviour(SimulatorModel(name="m", tokens=120, tokens_sd=30, seed=2))
    lengths = [len(behaviour.completion(f"prompt {i}".encode(), None)[0]) for i in range(5_000)]
    assert statistics.fmean(lengths) == pytest.approx(120, rel=0.03)
    assert statistics.stdev(lengths) == pytest.approx(30, rel=0.1)


def test_a_more_verbose_model_answers_longer_on_the_same_prompts() -> None:
    base = ModelBehaviour(SimulatorModel(name="baseline", tokens=100, tokens_sd=20))
    verbose = ModelBehaviour(SimulatorModel(name="candidate", tokens=120, tokens_sd=24))
    prompts = [f"question {i}".encode() for i in range(2_000)]
    ratio = sum(len(verbose.completion(p, None)[0]) for p in prompts) / sum(
        len(base.completion(p, None)[0]) for p in prompts
    )
    assert ratio == pytest.approx(1.2, rel=0.03)


def test_draws_are_reproducible_for_a_seed_and_differ_across_seeds() -> None:
    def series(seed: int) -> list[float]:
        behaviour = ModelBehaviour(SimulatorModel(name="m", error_rate=0.1, seed=seed))
        return [behaviour.draw().latency_s for _ in range(50)]

    assert series(5) == series(5) != series(6)


def test_error_draws_match_the_error_rate_and_midstream_share() -> None:
    behaviour = ModelBehaviour(SimulatorModel(name="m", error_rate=0.2, midstream_error_share=0.5, seed=3))
    draws = [behaviour.draw() for _ in range(20_000)]
    errors = [d for d in draws if d.error]
    assert len(errors) / len(draws) == pytest.approx(0.2, abs=0.015)
    assert sum(d.midstream for d in errors) / len(errors) == pytest.approx(0.5, abs=0.03)
    assert not any(d.midstream and not d.error for d in draws)


def test_cli_spec_round_trips_and_rejects_bad_options() -> None:
    model = SimulatorModel.parse(
        "name=baseline,latency_ms=200,latency_sd=50,error_rate=0.01,quality=0.6,hang=no"
    )
    assert (model.name, model.latency_ms, model.error_rate, model.quality, model.hang) == (
        "baseline",
        200.0,
        0.01,
        0.6,
        False,
    )
    assert SimulatorModel.parse(model.to_spec()) == model
    with pytest.raises(ValueError, match="unknown"):
        SimulatorModel.parse("name=x,latencyms=3")
    with pytest.raises(ValueError, match="error_rate"):
        SimulatorModel.parse("name=x,error_rate=1.5")
    with pytest.raises(ValueError, match="name"):
        SimulatorModel.parse("latency_ms=3")


def test_models_load_from_json_and_yaml_files(tmp_path: Path) -> None:
    entries = [{"name": "a", "tokens": 50}, {"name": "b", "quality": 0.7, "hang": True}]
    (tmp_path / "m.json").write_text(json.dumps({"models": entries}))
    (tmp_path / "m.yaml").write_text("- name: a\n  tokens: 50\n- name: b\n  quality: 0.7\n  hang: true\n")
    from_json = load_models(tmp_path / "m.json", seed=9)
    assert from_json == load_models(tmp_path / "m.yaml", seed=9)
    assert from_json[1] == SimulatorModel(name="b", quality=0.7, hang=True, seed=9)
