"""Blinding through the real gateway with the real openai client: by default a client sees the
route it asked for as ``model`` (JSON and streamed) and no arm header unless it asks; each
experiment can choose otherwise."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, experiment, start_gateway, static_source

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about foxes."}]
SHOW = {"X-Liftgate-Show-Variant": "true"}


@pytest.fixture(scope="module")
def url(simulator: str) -> Iterator[str]:
    ups = [UpstreamConfig("sim", simulator, timeout_s=5.0)]
    arms = [
        VariantConfig("control", "sim", "base", 50, True),
        VariantConfig("cand", "sim", "cand", 50),
    ]
    exps = [
        experiment("blind", arms, exp_id=1),
        experiment("open", arms, exp_id=2, echo_model=False, variant_header="always"),
        experiment("sealed", arms, exp_id=3, variant_header="never"),
    ]
    with start_gateway(MemorySink(), static_source(exps, ups)) as g:
        yield g.url


def _client(url: str, headers: dict[str, str] | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="k", default_headers=headers or {})


def test_by_default_the_model_is_the_route_and_the_arm_is_not_named(url: str) -> None:
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6"):
        raw = _client(url).chat.completions.with_raw_response.create(model="blind", messages=MSG, user=unit)
        assert raw.parse().model == "blind"
        assert "x-liftgate-variant" not in raw.headers and "x-liftgate-experiment" not in raw.headers
        assert raw.headers["x-request-id"]  # feedback still needs it
        chunks = list(
            _client(url).chat.completions.create(model="blind", messages=MSG, user=unit, stream=True)
        )
        assert chunks and {c.model for c in chunks} == {"blind"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_client_that_asks_is_told_its_arm_but_the_model_stays_the_route(url: str) -> None:
    seen = set()
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"):
        raw = _client(url, SHOW).chat.completions.with_raw_response.create(
            model="blind", messages=MSG, user=unit
        )
        assert raw.parse().model == "blind"
        assert raw.headers["x-liftgate-experiment"] == "exp-blind"
        seen.add(raw.headers["x-liftgate-variant"])
    assert seen == {"control", "cand"}


def test_an_experiment_can_show_the_real_model_and_always_name_the_arm(url: str) -> None:
    models = {}
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"):
        raw = _client(url).chat.completions.with_raw_response.create(model="open", messages=MSG, user=unit)
        models[raw.headers["x-liftgate-variant"]] = raw.parse().model
    assert models == {"control": "base", "cand": "cand"}


def test_an_experiment_can_refuse_to_name_the_arm_even_when_asked(url: str) -> None:
    raw = _client(url, SHOW).chat.completions.with_raw_response.create(
        model="sealed", messages=MSG, user="u1"
    )
    assert raw.parse().model == "sealed" and "x-liftgate-variant" not in raw.headers
