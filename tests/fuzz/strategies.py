"""Hypothesis strategies for the gateway's hot path, which no OpenAPI document describes:
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/feedback``.

Each strategy draws a whole HTTP request (method, path, headers, body bytes) the way a
careless or hostile OpenAI client would send it: mostly well-formed requests to the routes
that exist — streamed or not, with odd but legal fields — mixed with wrong types, missing
fields, unknown models, control characters in identifiers, lone surrogates, numbers JSON
cannot hold, deep nesting, bodies that are not JSON, and missing or wrong client keys.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from contracts.events import FEEDBACK_KINDS

Request = dict[str, Any]  # keyword arguments of requests.Session.request (without the base URL)

# Text that reaches identifiers and logs: any code point, control characters and lone
# surrogates included (json.dumps escapes them; the gateway must refuse what it cannot store).
TEXT = st.text(max_size=16)
SHORT = st.text(max_size=8)
# Text a well-behaved client sends: no control characters.
CLEAN = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=16)
# Long text costs one draw (a character at a time would cost one each).
LONG = st.integers(min_value=0, max_value=20_000).map(lambda n: "word " * n)
# Header values travel as Latin-1; CR and LF cannot be sent at all.
HEADER_TEXT = st.text(
    st.characters(min_codepoint=0, max_codepoint=255, exclude_characters="\r\n"), max_size=24
)
SHORT_HEADER = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(SHORT, children, max_size=4),
    max_leaves=6,
)
# Numbers as JSON text that parsers disagree about: orjson refuses some, Python reads others as inf.
ODD_NUMBERS = st.sampled_from(
    ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1.7e308", "1" + "0" * 400, "-0"]
)


_MISSING = object()  # "leave the field out" (None is a value: JSON null)


def _pick(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each drawn with probability about proportional to its weight
    (Hypothesis leans towards the first: list the common case first)."""
    ladder: list[st.SearchStrategy[Any]] = []
    for weight, strategy in choices:
        ladder += [strategy] * weight
    return st.sampled_from(ladder).flatmap(lambda strategy: strategy)


def _maybe(strategy: st.SearchStrategy[Any], p_missing: float = 0.3) -> st.SearchStrategy[Any]:
    """The value, or (with probability ``p_missing``) the marker for a field left out."""
    cut = round(p_missing * 100)
    return _pick((100 - cut, strategy), (cut, st.just(_MISSING)))


def _object(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object with each of ``fields`` present or not, plus a few unknown fields."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is not _MISSING:
                out[name] = value
        extra = draw(_maybe(st.dictionaries(SHORT, JSON, min_size=1, max_size=2), 0.7))
        for name, value in ({} if extra is _MISSING else extra).items():
            out.setdefault(name, value)
        return out

    return build()


def _roles() -> st.SearchStrategy[Any]:
    return _pick(
        (16, st.sampled_from(["system", "user", "assistant", "tool", "developer"])), (1, TEXT), (1, JSON)
    )


def _content() -> st.SearchStrategy[Any]:
    part = _object(
        {"type": _maybe(st.sampled_from(["text", "image_url"]) | TEXT), "text": _maybe(TEXT | JSON)}
    )
    return _pick((5, TEXT), (2, LONG), (2, st.lists(part, max_size=3)), (1, JSON))


def _messages() -> st.SearchStrategy[Any]:
    message = _object(
        {"role": _maybe(_roles(), 0.03), "content": _maybe(_content(), 0.1), "name": _maybe(TEXT, 0.8)}
    )
    return _pick(
        (8, st.lists(message, min_size=1, max_size=4)), (1, st.lists(message, max_size=0)), (1, JSON)
    )


def _common(models: list[str]) -> dict[str, st.SearchStrategy[Any]]:
    model = _pick((16, st.sampled_from(models)), (1, TEXT), (1, JSON))
    return {
        "model": _maybe(model, 0.03),
        "stream": _maybe(_pick((9, st.booleans()), (1, JSON)), 0.4),
        "stream_options": _maybe(
            _pick((6, _object({"include_usage": _maybe(st.booleans() | JSON)})), (1, JSON)), 0.8
        ),
        "user": _maybe(_pick((8, CLEAN), (1, TEXT), (1, JSON)), 0.5),
        "metadata": _maybe(st.dictionaries(SHORT, TEXT, max_size=3) | JSON, 0.7),
        "max_tokens": _maybe(st.integers(min_value=-(2**40), max_value=2**40) | JSON, 0.6),
        "temperature": _maybe(st.floats(allow_nan=False, allow_infinity=False) | JSON, 0.7),
        "n": _maybe(st.integers(min_value=-3, max_value=5) | JSON, 0.9),
    }


def _body(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """Mostly the JSON of an object with ``fields``; sometimes bytes no client should send."""
    well_formed = _object(fields).map(lambda body: json.dumps(body).encode())
    nested = st.integers(min_value=1, max_value=400).map(lambda depth: b"[" * depth + b"]" * depth)
    odd_number = st.tuples(st.sampled_from(list(fields)), ODD_NUMBERS).map(
        lambda kv: b'{"%s": %s}' % (kv[0].encode(), kv[1].encode())
    )
    deep_field = st.tuples(st.sampled_from(list(fields)), st.integers(min_value=50, max_value=300)).map(
        lambda kv: b'{"%s": %s1%s}' % (kv[0].encode(), b'{"a":' * kv[1], b"}" * kv[1])
    )
    return _pick(
        (30, well_formed),
        (1, st.binary(max_size=64)),
        (1, JSON.map(lambda value: json.dumps(value).encode())),
        (1, nested),
        (1, odd_number),
        (1, deep_field),
    )


def _headers(client_key: str) -> st.SearchStrategy[dict[str, str]]:
    auth = _pick(
        (30, st.just(f"Bearer {client_key}")),
        (1, st.just(_MISSING)),
        (1, HEADER_TEXT),
        (1, HEADER_TEXT.map(lambda s: "Bearer " + s)),
    )

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, str]:
        headers = {"Content-Type": draw(_pick((8, st.just("application/json")), (1, HEADER_TEXT)))}
        value = draw(auth)
        if value is not _MISSING:
            headers["Authorization"] = value
        for name in ("X-Liftgate-Unit", "X-Liftgate-Tags", "X-Liftgate-Conversation"):
            value = draw(
                _maybe(_pick((4, st.just("team=a,plan=pro")), (4, SHORT_HEADER), (1, HEADER_TEXT)), 0.7)
            )
            if value is not _MISSING:
                headers[name] = value
        return headers

    return build()


def completions(endpoint: str, models: list[str], client_key: str) -> st.SearchStrategy[Request]:
    """A POST to one of the three completion paths."""
    fields = _common(models)
    if endpoint == "chat":
        path, fields["messages"] = "/v1/chat/completions", _maybe(_messages(), 0.05)
    elif endpoint == "completions":
        path, fields["prompt"] = (
            "/v1/completions",
            _maybe(_pick((4, TEXT), (2, st.lists(TEXT, max_size=3)), (1, JSON)), 0.05),
        )
    else:
        path, fields["input"] = (
            "/v1/embeddings",
            _maybe(_pick((4, TEXT), (2, st.lists(TEXT, max_size=3)), (1, JSON)), 0.05),
        )
        fields["encoding_format"] = _maybe(st.sampled_from(["float", "base64"]) | TEXT, 0.8)
    return st.builds(
        lambda headers, body: {"method": "POST", "url": path, "headers": headers, "data": body},
        _headers(client_key),
        _body(fields),
    )


def feedback(request_ids: list[str], client_key: str) -> st.SearchStrategy[Request]:
    """A POST to ``/v1/feedback`` about a response that exists, or one that does not."""
    value = st.one_of(
        st.sampled_from([None, True, False, 0, 1, 0.5, 10, 11, -1, 1e9, 1.7e308, -1.7e308]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.integers(min_value=-(2**70), max_value=2**70),
        JSON,
    )
    fields = {
        "request_id": _maybe(
            _pick((12, st.sampled_from(request_ids)), (2, CLEAN), (1, TEXT), (1, JSON)), 0.03
        ),
        "kind": _maybe(
            _pick(
                (6, st.sampled_from(sorted(FEEDBACK_KINDS))),
                (2, st.from_regex(r"\A[a-z][a-z0-9_.\-]{0,70}\Z")),
                (1, TEXT),
                (1, JSON),
            ),
            0.03,
        ),
        "value": _maybe(value, 0.3),
        "unit_id": _maybe(_pick((8, CLEAN), (1, TEXT), (1, JSON)), 0.6),
        "tags": _maybe(st.dictionaries(SHORT, TEXT, max_size=20) | HEADER_TEXT | JSON, 0.6),
    }
    return st.builds(
        lambda headers, body: {"method": "POST", "url": "/v1/feedback", "headers": headers, "data": body},
        _headers(client_key),
        _body(fields),
    )


# --- the analytics service's dashboard (not in its OpenAPI document) -------------------------

URL_TEXT = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#?"), max_size=24
)
# Where a sign-in may send the browser next: only this service's own dashboard paths are
# honoured; the rest are open-redirect attempts.
NEXT = (
    st.sampled_from(
        [
            "/dashboard",
            "/dashboard/experiments/x",
            "//evil.example/x",
            "/\\evil.example",
            "https://evil.example",
            "javascript:alert(1)",
            "/dashboard/../admin",
            "/%2F%2Fevil.example",
            "\\\\evil",
            "/dashboard\r\nSet-Cookie: x=1",
        ]
    )
    | URL_TEXT
)


def _path_segment() -> st.SearchStrategy[str]:
    escaped = st.text(max_size=12).map(lambda t: urllib.parse.quote(t, safe=""))
    traversal = st.sampled_from(
        [
            "..%2F..%2Fsettings.py",
            "../../analytics/app.py",
            "%2e%2e/%2e%2e/",
            "css/../../x",
            "js/api.js",
            "js/app.js",
            "css/app.css",
            "%00",
            "a%00b",
            "%C0%AE%C0%AE/",
        ]
    )
    return _pick((3, escaped), (3, URL_TEXT.map(lambda t: urllib.parse.quote(t, safe="/"))), (2, traversal))


def dashboard(experiments: list[str], read_token: str, admin_token: str) -> st.SearchStrategy[Request]:
    """A browser (or someone pretending to be one) on the dashboard and its sign-in page."""
    cookie = _pick(
        (2, st.just(_MISSING)),
        (1, st.builds(lambda a, b, c: f"lg_session={a}.{b}.{c}", st.integers(0, 10**13), URL_TEXT, URL_TEXT)),
        (1, HEADER_TEXT.map(lambda t: "lg_session=" + t)),
    )
    auth = _pick(
        (3, st.just(f"Bearer {read_token}")),
        (2, st.just(_MISSING)),
        (1, st.just(f"Bearer {admin_token}")),
        (1, HEADER_TEXT),
    )
    form = st.fixed_dictionaries(
        {"token": _pick((2, st.just(read_token)), (2, TEXT), (1, st.just(admin_token))), "next": NEXT}
    ).map(lambda f: urllib.parse.urlencode(f).encode())
    ticket = st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.integers(0, 10**13), URL_TEXT, URL_TEXT) | URL_TEXT
    query = st.fixed_dictionaries({}, optional={"ticket": ticket, "next": NEXT}).map(urllib.parse.urlencode)
    ref = _pick((2, st.sampled_from(experiments)), (3, _path_segment()))

    @st.composite
    def build(draw: st.DrawFn) -> Request:
        headers: dict[str, str] = {}
        for name, value in (("Cookie", draw(cookie)), ("Authorization", draw(auth))):
            if value is not _MISSING:
                headers[name] = value
        kind = draw(st.sampled_from(["static", "page", "list", "login-get", "login-post", "logout", "docs"]))
        method, data = "GET", None
        if kind == "static":
            url = "/dashboard/static/" + draw(_path_segment())
        elif kind == "page":
            url = "/dashboard/experiments/" + draw(ref)
        elif kind == "list":
            url = draw(st.sampled_from(["/dashboard", "/dashboard/", "/dashboard/experiments/"]))
        elif kind == "login-get":
            url = "/dashboard/login?" + draw(query)
        elif kind == "login-post":
            method, url, data = "POST", "/dashboard/login", draw(form | st.binary(max_size=64))
            headers["Content-Type"] = draw(
                st.sampled_from(["application/x-www-form-urlencoded", "text/plain"])
            )
        elif kind == "logout":
            method, url = "POST", "/dashboard/logout"
        else:
            url = draw(st.sampled_from(["/docs", "/openapi.json", "/docs/oauth2-redirect"]))
        return {"method": method, "url": url, "headers": headers, "data": data}

    return build()


def build(name: str, extra: dict[str, Any]) -> st.SearchStrategy[Request]:
    """The strategy ``hot:<name>`` of a fuzz shard (``extra``: what each one draws from)."""
    factories: dict[str, Callable[[], st.SearchStrategy[Request]]] = {
        "dashboard": lambda: dashboard(extra["experiments"], extra["read_token"], extra["admin_token"]),
        "chat": lambda: completions("chat", extra["models"], extra["client_key"]),
        "completions": lambda: completions("completions", extra["models"], extra["client_key"]),
        "embeddings": lambda: completions("embeddings", extra["models"], extra["client_key"]),
        "feedback": lambda: feedback(extra["request_ids"], extra["client_key"]),
    }
    return factories[name]()
