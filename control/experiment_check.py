"""Checking an experiment before creating it: the dashboard's live validation.

The check *is* the create: :func:`control.config.create_experiment` runs inside a savepoint
of a transaction that is always rolled back, so the answer carries exactly the reasons a
real ``POST /admin/experiments`` would give (body shape, variants, upstreams, duplicate
name), and nothing is written. The body may be the experiment as JSON or ``{"yaml": text}``
(what the dashboard's paste box sends): YAML is parsed safely and refused when it uses
anchors or aliases (a few lines of them expand to billions of nodes).
"""

from __future__ import annotations

from typing import Any, Final

import yaml
from pydantic import ValidationError
from sqlalchemy.orm import Session

from control import config
from control.bodies import ExperimentIn
from control.errors import ControlError
from control.plane import ControlPlane

MAX_YAML_CHARS: Final = 200_000


def parse_yaml(text: str) -> Any:
    """The document in ``text``; 422 for invalid YAML or any alias."""
    if len(text) > MAX_YAML_CHARS:
        raise ControlError(422, f"yaml: longer than {MAX_YAML_CHARS} characters")
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise ControlError(422, "yaml: anchors and aliases (*name) are not accepted")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ControlError(422, f"yaml: {exc}") from None


def reason(exc: ValidationError) -> str:
    """A validation error as the service's handler words it: ``field.path: message``."""
    errors = exc.errors()
    if not errors:
        return "invalid request"
    where = ".".join(str(p) for p in errors[0]["loc"])
    return f"{where}: {errors[0]['msg']}" if where else errors[0]["msg"]


def experiment_body(body: Any) -> ExperimentIn:
    """The experiment in ``body`` (JSON, or ``{"yaml": text}``), validated as the API does."""
    if isinstance(body, dict) and set(body) == {"yaml"} and isinstance(body["yaml"], str):
        body = parse_yaml(body["yaml"])
    if not isinstance(body, dict):
        raise ControlError(422, "an experiment must be a mapping (name, route, mode, variants…)")
    try:
        return ExperimentIn.model_validate(body)
    except ValidationError as exc:
        raise ControlError(422, reason(exc)) from None


def check(plane: ControlPlane, body: Any, actor: str) -> dict[str, Any]:
    """What creating ``body`` would return, or the ControlError it would raise; writes nothing."""
    parsed = experiment_body(body)
    with plane.engine.connect() as conn:
        outer = conn.begin()
        try:
            with Session(bind=conn, join_transaction_mode="create_savepoint") as db:
                created = config.create_experiment(db, parsed, actor)
        finally:
            outer.rollback()
    return {"ok": True, "body": parsed.model_dump(exclude_none=True), "experiment": created}
