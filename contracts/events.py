"""The event contract: what the gateway emits and the analytics service ingests.

Events are versioned JSON (``schema_version``) encoded with orjson. ``event_id`` is a
time-ordered UUID (v7) and the idempotency key: ingest inserts ``ON CONFLICT (event_id)
DO NOTHING``, so at-least-once delivery has an exactly-once effect. The Kafka key is the
unit id, so one unit's events stay ordered in one partition.

Encoding is on the gateway's hot path, so events are plain slotted dataclasses that
orjson serialises natively; decoding (on the consumer) validates every field and
raises :class:`DecodeError` with a reason the consumer stores in the dead-letter table.
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin, get_type_hints

import msgspec
import orjson
from sqlalchemy import String

from contracts.ids import uuid7
from contracts.tables import Feedback, Interaction, Judgement, ResponseNgrams

SCHEMA_VERSION: Final = 1

INTERACTIONS_TOPIC: Final = "liftgate.interactions"
#: Tag the gateway adds to every attributed call of a running rollout: the stage index it was
#: served under. Analytics rolls tags up per segment, so the rollout controller can compare
#: control and candidate on the same time window (the current stage), not on cumulative
#: totals that mix stages (units join the candidate later, and anything that drifts over
#: time would otherwise look like a difference between the variants).
ROLLOUT_STAGE_TAG: Final = "rollout_stage"
FEEDBACK_TOPIC: Final = "liftgate.feedback"
#: The sampled, off-the-hot-path records of a response: judge scores and hashed n-grams.
JUDGEMENTS_TOPIC: Final = "liftgate.judgements"

#: primary: the call whose answer the user got; shadow: a mirrored call (never returned);
#: attempt: a candidate call that failed and was retried on the control (fallback) — kept
#: for the record, while the served primary event carries ``fallback=True``.
Role = Literal["primary", "shadow", "attempt"]
Mode = Literal["ab", "shadow", "rollout", "none"]
Endpoint = Literal["chat", "completions", "embeddings"]
Status = Literal["ok", "error"]
UnitSource = Literal["header", "user", "api_key", "random"]

#: Feedback kinds with a built-in meaning; any other name matching ``CUSTOM_KIND`` is a
#: custom signal (its ``value`` is summed per unit).
FEEDBACK_KINDS: Final = frozenset(
    {"thumbs_up", "thumbs_down", "rating", "regenerate", "copy", "edit", "continued", "task_success"}
)


#: Feedback values are bounded (both signs): a unit's sums then stay far from float8's range
#: whatever the number of events, and a report can square them. The gateway refuses larger
#: values with a 400; the consumer dead-letters them (it never relies on the gateway).
FEEDBACK_VALUE_MAX: Final = 1e9
#: Durations (latency, time to first token) above this many ms (~11.6 days) are refused.
DURATION_MAX_MS: Final = 1e9
#: Tags: at most this many per event, and "key=value" must fit a segment (256 characters).
TAGS_MAX: Final = 64
TAG_KEY_MAX: Final = 127
TAG_VALUE_MAX: Final = 128


class DecodeError(ValueError):
    """A message that is not a valid event; ``reason`` says why (stored with dead letters)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_event_id() -> str:
    """A time-ordered UUID (v7): unique, and sorts by creation time (to the millisecond)."""
    return uuid7()


def now() -> float:
    return time.time()


@dataclass(slots=True)
class InteractionEvent:
    """One model call made by the gateway: a primary call a user saw, or a shadow call."""

    request_id: str
    route: str
    unit_id: str
    unit_source: UnitSource
    role: Role
    mode: Mode
    endpoint: Endpoint
    model: str
    upstream: str
    status: Status
    http_status: int
    latency_ms: float
    experiment_id: int | None = None
    experiment: str | None = None
    variant: str | None = None
    pair_id: str | None = None
    error_type: str | None = None
    ttft_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    response_chars: int = 0
    finish_reason: str | None = None
    stream: bool = False
    fallback: bool = False
    fallback_from: str | None = None
    conversation_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    prompt: str | None = None
    response: str | None = None
    #: The task category assigned before treatment (gateway.category); None for embeddings,
    #: calls outside a running experiment, and events of gateways that predate it.
    category: str | None = None
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=now)
    schema_version: int = SCHEMA_VERSION
    type: Literal["interaction"] = "interaction"

    @property
    def key(self) -> bytes:
        return self.unit_id.encode()


@dataclass(slots=True)
class FeedbackEvent:
    """A signal from the user about one response, identified by its request id."""

    request_id: str
    unit_id: str
    kind: str
    value: float = 1.0
    experiment_id: int | None = None
    variant: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=now)
    schema_version: int = SCHEMA_VERSION
    type: Literal["feedback"] = "feedback"

    @property
    def key(self) -> bytes:
        return self.unit_id.encode()


@dataclass(slots=True)
class JudgeEvent:
    """A judge's or reward model's score of one response, linked by the judged call's
    ``request_id`` (a primary call, or a shadow call with ``pair_id`` = its primary's id).

    ``event_id`` is derived from (request id, judge) by :func:`judge_event_id`, so a
    judgement delivered twice is stored once. ``status="error"`` (with ``error_type``) when
    the judge failed or gave no score: the sample is known to be missing, not silently lost.
    """

    request_id: str
    unit_id: str
    judge: str
    role: Role
    status: Status
    latency_ms: float
    experiment_id: int | None = None
    variant: str | None = None
    pair_id: str | None = None
    category: str | None = None
    score: float | None = None
    error_type: str | None = None
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=now)
    schema_version: int = SCHEMA_VERSION
    type: Literal["judge"] = "judge"

    @property
    def key(self) -> bytes:
        return self.unit_id.encode()


_JUDGE_NAMESPACE: Final = uuid.UUID("6b1f3c0e-5d0a-4f7e-9a51-4c2b7f1e9d10")


def judge_event_id(request_id: str, judge: str) -> str:
    """The idempotency key of a judgement: one per (judged call, judge)."""
    return str(uuid.uuid5(_JUDGE_NAMESPACE, f"{request_id}\x00{judge}"))


@dataclass(slots=True)
class NgramsEvent:
    """The keyed hashes of one response's word 1–3-grams (content logging ``hashed``,
    :mod:`contracts.ngrams`): never the text. Linked to its call by ``request_id``;
    ``key_id`` names the key that made them. ``event_id`` is derived from the request id
    (:func:`ngrams_event_id`), so a re-delivered event is stored once."""

    request_id: str
    unit_id: str
    role: Role
    key_id: str
    grams: list[int]
    experiment_id: int | None = None
    variant: str | None = None
    category: str | None = None
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=now)
    schema_version: int = SCHEMA_VERSION
    type: Literal["ngrams"] = "ngrams"

    @property
    def key(self) -> bytes:
        return self.unit_id.encode()


_NGRAMS_NAMESPACE: Final = uuid.UUID("0d7e1c52-3b8f-4a1e-8f6d-2a9b5c7e4f31")


def ngrams_event_id(request_id: str) -> str:
    """The idempotency key of a response's hashed grams: one per call."""
    return str(uuid.uuid5(_NGRAMS_NAMESPACE, request_id))


#: Bounds of ``NgramsEvent.grams``: signed 64-bit values, at most this many per response.
GRAMS_MAX: Final = 8192
_INT8: Final = (-(2**63), 2**63 - 1)

Event = InteractionEvent | FeedbackEvent | JudgeEvent | NgramsEvent


def encode(event: Event) -> bytes:
    return orjson.dumps(event)


# --- decoding -------------------------------------------------------------------------

_STR, _INT, _FLOAT, _BOOL, _DICT, _LIST = "str", "int", "float", "bool", "dict", "list"
_PY_TYPES: dict[str, tuple[type, ...]] = {
    _STR: (str,),
    _INT: (int,),
    _FLOAT: (int, float),
    _BOOL: (bool,),
    _DICT: (dict,),
    _LIST: (list,),
}


def _literal_fields(cls: type) -> dict[str, frozenset[str]]:
    """Fields annotated with a Literal -> their allowed values (``type`` is the tag)."""
    return {
        name: frozenset(get_args(t))
        for name, t in get_type_hints(cls).items()
        if get_origin(t) is Literal and name != "type"
    }


# role, mode, endpoint, status, unit_source: from the annotations, which msgspec enforces on
# the fast path of ``decode`` too.
_LITERALS: dict[str, frozenset[str]] = _literal_fields(InteractionEvent)


def _field_kinds(cls: type) -> dict[str, tuple[str, bool, bool]]:
    """name -> (kind, optional, required) derived once from the dataclass annotations."""
    out: dict[str, tuple[str, bool, bool]] = {}
    for f in dataclasses.fields(cls):
        parts = {p.strip().split("[", 1)[0] for p in str(f.type).split("|")}
        optional = "None" in parts
        kind = next((k for k in (_DICT, _LIST, _BOOL, _FLOAT, _INT) if k in parts), _STR)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (kind, optional, required)
    return out


_INTERACTION_FIELDS = _field_kinds(InteractionEvent)
_FEEDBACK_FIELDS = _field_kinds(FeedbackEvent)
_JUDGE_FIELDS = _field_kinds(JudgeEvent)
_NGRAMS_FIELDS = _field_kinds(NgramsEvent)
_NAME_MAX = 256

# What decode accepts can be stored: PostgreSQL refuses a whole batch for one value it
# cannot hold, so every bound of the tables is checked here and such an event becomes a
# dead letter with its reason instead. Text: the length of its column, no NUL (PostgreSQL
# text cannot hold one). Numbers: finite, within the column's range (int4), timestamps
# within years 1970-9999, durations and feedback values bounded (sums stay finite).
_INT4: Final = (0, 2**31 - 1)
_TS_MAX: Final = 253_402_300_799.0  # 9999-12-31T23:59:59Z
_UUID_LEN: Final = (32, 36)  # hex digits, with or without the four hyphens


def _text_limits(table: Any) -> dict[str, int]:
    """Column name -> its maximum length, for the table's bounded text columns."""
    return {
        c.name: int(c.type.length)
        for c in table.__table__.columns
        if isinstance(c.type, String) and c.type.length is not None
    }


_TEXT_MAX: Final = {
    "interaction": _text_limits(Interaction),
    "feedback": _text_limits(Feedback),
    "judge": _text_limits(Judgement),
    "ngrams": _text_limits(ResponseNgrams),
}
_RANGES: Final[dict[str, dict[str, tuple[float, float]]]] = {
    "interaction": {
        "ts": (0.0, _TS_MAX),
        "http_status": (0, 999),
        "latency_ms": (0.0, DURATION_MAX_MS),
        "ttft_ms": (0.0, DURATION_MAX_MS),
        "experiment_id": _INT4,
        "prompt_tokens": _INT4,
        "completion_tokens": _INT4,
        "response_chars": _INT4,
    },
    "feedback": {
        "ts": (0.0, _TS_MAX),
        "value": (-FEEDBACK_VALUE_MAX, FEEDBACK_VALUE_MAX),
        "experiment_id": _INT4,
    },
    "judge": {
        "ts": (0.0, _TS_MAX),
        "latency_ms": (0.0, DURATION_MAX_MS),
        "score": (-FEEDBACK_VALUE_MAX, FEEDBACK_VALUE_MAX),
        "experiment_id": _INT4,
    },
    "ngrams": {"ts": (0.0, _TS_MAX), "experiment_id": _INT4},
}


def _check_storable(what: str, name: str, kind: str, value: Any) -> None:
    """The bounds above for one field of the right type (the reason names the field)."""
    if kind == _STR:
        if "\x00" in value:
            raise DecodeError(f"{what}: field '{name}' contains a NUL character")
        limit = _TEXT_MAX[what].get(name)
        if limit is not None and len(value) > limit:
            raise DecodeError(f"{what}: field '{name}' is longer than {limit} characters")
        if name == "event_id" and not _UUID_LEN[0] <= len(value) <= _UUID_LEN[1]:
            raise DecodeError(f"{what}: field 'event_id' must be a UUID")
    elif kind in (_INT, _FLOAT):
        lo, hi = _RANGES[what].get(name, (-math.inf, math.inf))
        if not lo <= value <= hi:
            raise DecodeError(f"{what}: field '{name}' must be between {lo:g} and {hi:g}, got {value:.6g}")
    elif kind == _LIST:  # NgramsEvent.grams
        if len(value) > GRAMS_MAX:
            raise DecodeError(f"{what}: field '{name}' has more than {GRAMS_MAX} entries")
        lo, hi = _INT8
        if not all(type(v) is int and lo <= v <= hi for v in value):
            raise DecodeError(f"{what}: field '{name}' must hold signed 64-bit integers")
    elif kind == _DICT:
        if len(value) > TAGS_MAX:
            raise DecodeError(f"{what}: field '{name}' has more than {TAGS_MAX} entries")
        for k, v in value.items():
            if "\x00" in k or "\x00" in v:
                raise DecodeError(f"{what}: field '{name}' contains a NUL character")
            if len(k) > TAG_KEY_MAX or len(v) > TAG_VALUE_MAX:
                raise DecodeError(
                    f"{what}: field '{name}': keys are at most {TAG_KEY_MAX} characters, values {TAG_VALUE_MAX}"
                )


def _check(data: dict[str, Any], spec: dict[str, tuple[str, bool, bool]], what: str) -> None:
    unknown = data.keys() - spec.keys()
    if unknown:
        raise DecodeError(f"{what}: unknown field(s) {sorted(unknown)}")
    for name, (kind, optional, required) in spec.items():
        if name not in data:
            if required:
                raise DecodeError(f"{what}: missing required field '{name}'")
            continue
        value = data[name]
        if value is None:
            if not optional:
                raise DecodeError(f"{what}: field '{name}' must not be null")
            continue
        ok = isinstance(value, _PY_TYPES[kind]) and not (kind in (_INT, _FLOAT) and isinstance(value, bool))
        if not ok:
            raise DecodeError(f"{what}: field '{name}' must be {kind}, got {type(value).__name__}")
        if kind == _FLOAT and value != value:  # NaN
            raise DecodeError(f"{what}: field '{name}' is NaN")
        if kind == _DICT and not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise DecodeError(f"{what}: field '{name}' must map strings to strings")
        allowed = _LITERALS.get(name)
        if allowed is not None and value not in allowed:
            raise DecodeError(f"{what}: field '{name}' has invalid value {value!r}")
        _check_storable(what, name, kind, value)
    if not data.get("event_id"):
        raise DecodeError(f"{what}: empty event_id")


def _bounded(what: str, name: str, t: Any) -> Any:
    """``t`` with the bounds of ``_check_storable`` as msgspec constraints (checked in C)."""
    optional = get_origin(t) in (Union, types.UnionType) and type(None) in get_args(t)
    base = next(a for a in get_args(t) if a is not type(None)) if optional else t
    if base is str and name in _TEXT_MAX[what]:
        base = Annotated[str, msgspec.Meta(max_length=_TEXT_MAX[what][name])]
    elif base is str and name == "event_id":
        # The length only: a pattern would be paid per event; the database refuses
        # the rare malformed id and ingest isolates that event (see analytics.ingest.write).
        base = Annotated[str, msgspec.Meta(min_length=_UUID_LEN[0], max_length=_UUID_LEN[1])]
    elif base in (int, float) and name in _RANGES[what]:
        lo, hi = _RANGES[what][name]
        base = Annotated[base, msgspec.Meta(ge=lo, le=hi)]
    elif get_origin(base) is list:
        item = Annotated[int, msgspec.Meta(ge=_INT8[0], le=_INT8[1])]
        base = Annotated[list[item], msgspec.Meta(max_length=GRAMS_MAX)]
    elif get_origin(base) is dict:
        key = Annotated[str, msgspec.Meta(max_length=TAG_KEY_MAX)]
        val = Annotated[str, msgspec.Meta(max_length=TAG_VALUE_MAX)]
        base = Annotated[dict[key, val], msgspec.Meta(max_length=TAGS_MAX)]
    else:
        return t
    return base | None if optional else base


def _wire_struct(cls: type, tag: str) -> Any:
    """A msgspec Struct mirroring ``cls``: same fields, order and types, unknown fields refused.

    msgspec parses and type-checks a message into it in one C pass (~2 µs here against
    ~12 µs for ``orjson.loads`` + the checks below + the dataclass); ``decode`` uses it as a
    fast *accept* path only: whatever it refuses goes through the full check, which
    explains the reason (or accepts what msgspec is stricter about).
    """
    hints = get_type_hints(cls)
    fields: list[Any] = []
    for f in dataclasses.fields(cls):
        if f.name == "type":
            continue  # the tag
        t = Literal[1] if f.name == "schema_version" else _bounded(tag, f.name, hints[f.name])
        if f.name in ("event_id", "schema_version"):  # a message must carry both
            fields.append((f.name, t))
        elif f.default is not dataclasses.MISSING:
            fields.append((f.name, t, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, t, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, t))
    # kw_only: the dataclass's field order is kept (required after optional), so a
    # decoded struct's astuple() is the dataclass's positional arguments.
    # gc=False: a wire struct lives only until ``decode`` copies it into the event, and its
    # values (str, numbers, a dict of str, a list of int) cannot form a reference cycle, so
    # the collector need not track it (cheaper to create and to free).
    return msgspec.defstruct(
        f"Wire{cls.__name__}",
        fields,
        tag_field="type",
        tag=tag,
        forbid_unknown_fields=True,
        kw_only=True,
        gc=False,
    )


_WIRE_INTERACTION: Final = _wire_struct(InteractionEvent, "interaction")
_WIRE_FEEDBACK: Final = _wire_struct(FeedbackEvent, "feedback")
_WIRE_JUDGE: Final = _wire_struct(JudgeEvent, "judge")
_WIRE_NGRAMS: Final = _wire_struct(NgramsEvent, "ngrams")
_WIRE_DECODER: Final = msgspec.json.Decoder(_WIRE_INTERACTION | _WIRE_FEEDBACK | _WIRE_JUDGE | _WIRE_NGRAMS)
#: How ``encode`` ends an interaction (the dataclass's last field is its tag). A message
#: ending so is an object whose top-level ``type`` is "interaction" (the final brace closes
#: the top level, and a string cannot hold an unescaped quote), so it is decoded as that
#: struct alone: the union decoder, whose tag is not the first key, reads the message twice.
_INTERACTION_TAIL: Final = b'"type":"interaction"}'
_WIRE_INTERACTION_DECODER: Final = msgspec.json.Decoder(_WIRE_INTERACTION)
_astuple: Final = msgspec.structs.astuple


def decode(raw: bytes | str) -> Event:
    """Parse and validate one message; raise DecodeError with a clear reason otherwise.

    A NUL character can only reach a JSON string as the escape ``\\u0000``: a message
    holding that text goes to the full check, which looks at the decoded values. (A
    backslash is looked for first: one ``memchr``, where the six-byte search costs ~0.4 µs.)
    """
    if isinstance(raw, str):
        if "\\u0000" in raw:
            return _decode_checked(raw)
    elif b"\\" in raw and b"\\u0000" in raw:
        return _decode_checked(raw)
    try:
        if isinstance(raw, bytes) and raw.endswith(_INTERACTION_TAIL):
            w = _WIRE_INTERACTION_DECODER.decode(raw)
        else:
            w = _WIRE_DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeEncodeError):
        return _decode_checked(raw)
    if type(w) is _WIRE_INTERACTION:
        if w.event_id:
            return InteractionEvent(*_astuple(w))
    elif type(w) is _WIRE_JUDGE:
        return _decode_checked(raw)  # rare (a few % of calls): the full check, NaN included
    elif type(w) is _WIRE_NGRAMS:
        # msgspec checked every gram's range and the count; the texts are ids and names
        if w.event_id and w.key_id:
            return NgramsEvent(*_astuple(w))
        return _decode_checked(raw)
    elif w.event_id and w.kind and len(w.kind) <= _NAME_MAX:
        return FeedbackEvent(*_astuple(w))
    return _decode_checked(raw)


def _decode_checked(raw: bytes | str) -> Event:
    """The full check: accepts exactly what the contract allows, else says why."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DecodeError(f"event must be a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema_version {version!r} (this build reads {SCHEMA_VERSION})")
    kind = data.get("type")
    if kind == "interaction":
        _check(data, _INTERACTION_FIELDS, "interaction")
        return InteractionEvent(**data)
    if kind == "feedback":
        _check(data, _FEEDBACK_FIELDS, "feedback")
        if not data["kind"] or len(data["kind"]) > _NAME_MAX:
            raise DecodeError("feedback: 'kind' must be a non-empty name of at most 256 characters")
        return FeedbackEvent(**data)
    if kind == "judge":
        _check(data, _JUDGE_FIELDS, "judge")
        if not data["judge"]:
            raise DecodeError("judge: 'judge' must be a non-empty name")
        return JudgeEvent(**data)
    if kind == "ngrams":
        _check(data, _NGRAMS_FIELDS, "ngrams")
        if not data["key_id"]:
            raise DecodeError("ngrams: 'key_id' must be a non-empty key fingerprint")
        return NgramsEvent(**data)
    raise DecodeError(f"unknown event type {kind!r}")


def topic_for(event: Event) -> str:
    if isinstance(event, InteractionEvent):
        return INTERACTIONS_TOPIC
    return JUDGEMENTS_TOPIC if isinstance(event, (JudgeEvent, NgramsEvent)) else FEEDBACK_TOPIC
