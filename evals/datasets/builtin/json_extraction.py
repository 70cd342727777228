"""JSON extraction with schemas: read facts from a sentence, answer with one JSON object.

Four record kinds (people, orders, events, sensor readings) × 13–14 seeded draws. Every
schema is closed (``additionalProperties: false``, all keys required, typed, some with
patterns, enums and ``format: date``) and every item has the exact expected object. The
wrong outputs: the right keys with a wrong type, a missing key, an extra key, a wrong
value, and two objects offered as alternatives.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from evals.datasets.builtin.common import BuiltinItem, make_item

SEED = 20264
FIRST = ("Ann", "Bruno", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivo", "Jade")
LAST = ("Lee", "Costa", "Wang", "Okafor", "Novak", "Haddad", "Berg", "Sato", "Rossi", "Moreau")
CITIES = ("Porto", "Lyon", "Osaka", "Nairobi", "Quito", "Tallinn", "Perth", "Bergen")
PRODUCTS = ("blue mug", "desk lamp", "wool scarf", "steel bottle", "phone stand", "tea tin")
Record = tuple[str, dict[str, Any], dict[str, Any], str]  # text, schema, expected, field to corrupt


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _person(r: random.Random) -> Record:
    name, age, city, member = (
        f"{r.choice(FIRST)} {r.choice(LAST)}",
        r.randint(18, 90),
        r.choice(CITIES),
        r.random() < 0.5,
    )
    text = f"{name} is {age} years old, lives in {city} and is {'a' if member else 'not a'} member of the rowing club."
    schema = _obj({"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0},
                   "city": {"type": "string"}, "member": {"type": "boolean"}})  # fmt: skip
    return text, schema, {"name": name, "age": age, "city": city, "member": member}, "age"


def _order(r: random.Random) -> Record:
    oid, qty, price = (
        f"{r.choice('ABCDEFGH')}-{r.randint(1000, 9999)}",
        r.randint(1, 40),
        r.randint(5, 400) / 4,
    )
    day = f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
    product = r.choice(PRODUCTS)
    text = f"Order {oid}: {qty} × '{product}' at {price:g} EUR each, shipped on {day}."
    schema = _obj({"order_id": {"type": "string", "pattern": "^[A-Z]-[0-9]{4}$"}, "product": {"type": "string"},
                   "quantity": {"type": "integer", "minimum": 1}, "unit_price": {"type": "number"},
                   "shipped": {"type": "string", "format": "date"}})  # fmt: skip
    expected = {"order_id": oid, "product": product, "quantity": qty, "unit_price": price, "shipped": day}
    return text, schema, expected, "quantity"


def _event(r: random.Random) -> Record:
    title = r.choice(("Spring Concert", "Chess Night", "Data Meetup", "Poetry Slam", "Film Club"))
    day, hour = (
        f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
        f"{r.randint(9, 22):02d}:{r.choice(('00', '15', '30', '45'))}",
    )
    room, seats = f"Hall {r.choice('ABCD')}", r.randint(20, 900)
    tags = r.sample(["music", "free", "family", "outdoor", "talk", "members"], 2)
    text = (
        f"'{title}' takes place on {day} at {hour} in {room}; {seats} seats; tagged {tags[0]} and {tags[1]}."
    )
    schema = _obj({"title": {"type": "string"}, "date": {"type": "string", "format": "date"},
                   "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}, "room": {"type": "string"},
                   "seats": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"},
                                                         "minItems": 2, "maxItems": 2}})  # fmt: skip
    expected = {"title": title, "date": day, "time": hour, "room": room, "seats": seats, "tags": tags}
    return text, schema, expected, "seats"


def _sensor(r: random.Random) -> Record:
    sensor, unit = f"S{r.randint(10, 99)}", r.choice(("C", "F"))
    readings = [r.randint(-200, 400) / 10 for _ in range(r.randint(3, 5))]
    text = f"Sensor {sensor} reported {', '.join(f'{x:g}' for x in readings)} (degrees {unit})."
    schema = _obj({"sensor": {"type": "string"}, "unit": {"enum": ["C", "F"]},
                   "readings": {"type": "array", "items": {"type": "number"}},
                   "max": {"type": "number"}})  # fmt: skip
    expected = {"sensor": sensor, "unit": unit, "readings": readings, "max": max(readings)}
    return text, schema, expected, "readings"


KINDS: tuple[tuple[Callable[[random.Random], Record], int], ...] = (
    (_person, 14), (_order, 14), (_event, 13), (_sensor, 13),
)  # fmt: skip


def _wrongs(expected: dict[str, Any], corrupt: str) -> tuple[str, ...]:
    wrong_type = {**expected, corrupt: json.dumps(expected[corrupt])}
    missing = {k: v for k, v in expected.items() if k != corrupt}
    extra = {**expected, "confidence": 0.9}
    first = next(iter(expected))
    value = expected[first]
    wrong_value = {**expected, first: (value + "x") if isinstance(value, str) else value}
    alternatives = json.dumps(expected) + "\n" + json.dumps(wrong_value)
    return (
        json.dumps(wrong_type),
        json.dumps(missing),
        json.dumps(extra),
        json.dumps(wrong_value),
        alternatives,
    )


def items() -> list[BuiltinItem]:
    rng = random.Random(SEED)
    out: list[BuiltinItem] = []
    for make, count in KINDS:
        for _ in range(count):
            text, schema, expected, corrupt = make(rng)
            prompt = (f"Extract the record from this text as one JSON object with exactly the keys "
                      f"{', '.join(expected)}.\nText: {text}\nJSON Schema: {json.dumps(schema)}\n"
                      "Reply with the JSON only.")  # fmt: skip
            scorer = {"type": "json_schema", "schema": schema, "expected": expected}
            reference = "```json\n" + json.dumps(expected, indent=2) + "\n```"
            out.append(make_item(f"json-{len(out) + 1:03d}", "json", prompt, scorer, reference,
                                 _wrongs(expected, corrupt), {"kind": make.__name__.strip("_")}))  # fmt: skip
    return out
