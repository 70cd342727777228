"""The simulator speaks OpenAI's protocol to the real openai SDK, in JSON and SSE."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import openai
import pytest

from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "explain sticky assignment"},
]


def test_sync_client_gets_a_chat_completion_with_usage_and_quality_header(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="good", messages=MESSAGES)
    completion = raw.parse()
    assert raw.headers["X-Sim-Quality"] == "0.8"
    assert completion.model == "good"
    assert completion.choices[0].finish_reason == "stop"
    content = completion.choices[0].message.content
    assert content and completion.usage is not None
    assert completion.usage.completion_tokens == len(content.split())
    assert completion.usage.prompt_tokens > 0
    client.close()


async def test_async_stream_equals_the_non_streamed_answer_and_ends_with_usage(simulator_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    full = await client.chat.completions.create(model="fast", messages=MESSAGES)
    stream = await client.chat.completions.create(
        model="fast", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    parts, finishes, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert "".join(parts) == full.choices[0].message.content
    assert finishes == ["stop"]
    assert usage is not None and full.usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens
    await client.close()


async def test_stream_without_include_usage_has_no_usage_chunk(simulator_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(model="fast", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    assert chunks and all(c.usage is None and c.choices for c in chunks)
    await client.close()


def test_completions_endpoint_streams_and_answers_deterministically(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    one = client.completions.create(model="fast", prompt="once upon a time")
    two = client.completions.create(model="fast", prompt="once upon a time")
    other = client.completions.create(model="fast", prompt="something else entirely")
    assert one.choices[0].text == two.choices[0].text != other.choices[0].text
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="fast", prompt="once upon a time", stream=True)
    )
    assert streamed == one.choices[0].text
    client.close()


def test_max_tokens_is_honoured_with_finish_reason_length(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    completion = client.chat.completions.create(model="timed", messages=MESSAGES, max_tokens=5)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    client.close()


def test_unknown_request_fields_are_accepted(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    completion = client.chat.completions.create(
        model="fast",
        messages=MESSAGES,
        extra_body={"top_k": 20, "repetition_penalty": 1.1, "guided_json": None, "priority": 3},
    )
    assert completion.choices[0].message.content
    client.close()


def test_embeddings_are_deterministic_unit_vectors_in_float_and_base64(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    first = client.embeddings.create(model="fast", input=["alpha", "beta"])  # SDK asks for base64
    floats = client.embeddings.create(model="fast", input=["alpha"], encoding_format="float")
    a, b = first.data[0].embedding, first.data[1].embedding
    assert len(a) == 64 and a != b
    assert abs(sum(x * x for x in a) - 1.0) < 1e-5
    assert floats.data[0].embedding == pytest.approx(a, abs=1e-6)
    client.close()


def test_models_endpoint_lists_every_served_model(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    assert {m.id for m in client.models.list()} == {
        "fast",
        "timed",
        "flaky",
        "broken-stream",
        "stuck",
        "good",
    }
    client.close()


def test_unknown_model_and_malformed_json_get_openai_errors(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    client.close()

    async def post_garbage() -> tuple[int, dict[str, object]]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(simulator_url + "/v1/chat/completions", data=b"{not json") as resp,
        ):
            return resp.status, await resp.json()

    status, body = asyncio.run(post_garbage())
    assert status == 400 and "error" in body


def test_latency_and_ttft_follow_the_configuration(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    started = time.perf_counter()
    client.chat.completions.create(model="timed", messages=MESSAGES)
    total = time.perf_counter() - started
    started = time.perf_counter()
    stream = client.chat.completions.create(model="timed", messages=MESSAGES, stream=True)
    first_content_at = None
    for chunk in stream:
        if first_content_at is None and chunk.choices and chunk.choices[0].delta.content:
            first_content_at = time.perf_counter() - started
    stream_total = time.perf_counter() - started
    assert 0.3 <= total < 0.6
    assert first_content_at is not None and 0.12 <= first_content_at < 0.25
    assert 0.3 <= stream_total < 0.6
    client.close()


async def test_error_rate_is_close_to_the_configured_share(simulator_url: str) -> None:
    n = 400
    payload = {"model": "flaky", "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(simulator_url + "/v1/chat/completions", json=payload) as resp:
                await resp.read()
                return resp.status

        statuses = await asyncio.gather(*(one() for _ in range(n)))
    share = statuses.count(500) / n
    assert set(statuses) <= {200, 500}
    # Binomial(400, 0.3): sd 0.023, so ±0.1 is > 4 sd.
    assert 0.2 < share < 0.4


def test_mid_stream_failure_reaches_the_sdk_as_an_api_error(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0)
    received: list[str] = []
    with pytest.raises(openai.APIError, match="mid-stream"):
        for chunk in client.chat.completions.create(model="broken-stream", messages=MESSAGES, stream=True):
            received.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(received)  # part of the answer arrived before the failure
    client.close()


async def test_a_hanging_model_never_answers_while_others_in_the_process_do(simulator_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=simulator_url + "/v1", api_key="unused", max_retries=0, timeout=1.0)
    hanging = asyncio.create_task(client.chat.completions.create(model="stuck", messages=MESSAGES))
    started = time.perf_counter()
    answer = await client.chat.completions.create(model="good", messages=MESSAGES)
    assert answer.choices[0].message.content and time.perf_counter() - started < 0.5
    assert not hanging.done()
    with pytest.raises(openai.APITimeoutError):
        await hanging
    await client.close()


def test_same_prompt_and_seed_give_the_same_text_across_processes() -> None:
    def answer(seed: int) -> str:
        model = SimulatorModel(name="m", latency_ms=1, ttft_ms=1, seed=seed)
        with SimulatorProcess([model]) as sim:
            client = openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)
            text = client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
            client.close()
            return text or ""

    assert answer(3) == answer(3) != answer(4)


def test_a_simulator_that_cannot_start_raises_instead_of_hanging() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sim = SimulatorProcess([SimulatorModel(name="m")], port=port, start_timeout_s=20)
        started = time.perf_counter()
        with pytest.raises(RuntimeError, match="did not start"):
            sim.start()
        assert time.perf_counter() - started < 20
