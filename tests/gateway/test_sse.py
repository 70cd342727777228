"""SSE relay framing: events split across reads, CRLF framing, usage-chunk stripping."""

from __future__ import annotations

import orjson

from gateway.relay import CallResult, SseFilter


def _chunk(content: str | None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    return b"data: " + orjson.dumps({"choices": choices, "usage": usage})


def _stream(sep: bytes) -> bytes:
    events = [
        _chunk("Hel"),
        _chunk("lo"),
        _chunk(None, {"prompt_tokens": 3, "completion_tokens": 2}),
        b"data: [DONE]",
    ]
    return b"".join(e + sep for e in events)


def _relay(raw: bytes, keep_usage: bool, piece: int) -> tuple[bytes, CallResult]:
    res = CallResult()
    flt = SseFilter(res, chat=True, keep_usage=keep_usage, keep_text=True, t0=0.0)
    out = b"".join(flt.feed(raw[i : i + piece]) for i in range(0, len(raw), piece)) + flt.flush()
    return out, res


def test_events_split_across_reads_are_reassembled_and_the_usage_chunk_is_dropped() -> None:
    for piece in (1, 7, 64, 10_000):
        out, res = _relay(_stream(b"\n\n"), keep_usage=False, piece=piece)
        assert b'"usage":{' not in out and out.endswith(b"data: [DONE]\n\n")
        assert (res.prompt_tokens, res.completion_tokens, res.chars, res.done) == (3, 2, 5, True)
        assert "".join(res.texts or []) == "Hello"


def test_usage_chunk_is_kept_when_the_client_asked_for_it() -> None:
    out, _ = _relay(_stream(b"\n\n"), keep_usage=True, piece=5)
    assert out == _stream(b"\n\n")


def test_crlf_framed_streams_are_parsed_and_relayed_in_their_framing() -> None:
    for piece in (3, 50, 10_000):
        out, res = _relay(_stream(b"\r\n\r\n"), keep_usage=False, piece=piece)
        assert out.endswith(b"data: [DONE]\r\n\r\n") and b'"usage":{' not in out
        assert (res.completion_tokens, res.chars, res.done) == (2, 5, True)
