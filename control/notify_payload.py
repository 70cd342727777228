"""What a webhook receives: the generic JSON body and the Slack-compatible one (pure).

Every notification is an envelope built when the event is queued
(:func:`control.notifications.emit`)::

    {"id": "evt_42", "type": "rollout.rollback", "created_at": "2026-…Z",
     "experiment": {"id": 3, "name": "ramp", "route": "chat"} | null,
     "data": {…what happened, by type…}}

``json`` webhooks get it as is; ``slack`` webhooks get ``{"text": …, "blocks": […]}`` (what
Slack's incoming webhooks and most chat bridges accept) with one line saying what happened.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

#: Every kind of event, and what it means (``liftgate webhooks add --events``).
KINDS: Final[dict[str, str]] = {
    "rollout.start": "a rollout began its first stage",
    "rollout.advance": "a rollout moved to its next stage",
    "rollout.hold": "a rollout holds at its stage (a new reason; repeats are not re-sent)",
    "rollout.rollback": "a rollout rolled back: the candidate gets no traffic",
    "rollout.promote": "a rollout promoted its candidate to everyone",
    "rollout.pause": "an operator paused a rollout",
    "rollout.resume": "an operator resumed a rollout",
    "srm": "sample ratio mismatch flagged at a rollout look",
    "guardrail.failed": "a guardrail was worse than its margin with confidence",
    "offline_gate.failed": "the offline gate refused a candidate",
    "rl_risk.alarm": "an RL-risk detector raised an alarm",
    "test": "a test notification (the test button, `liftgate webhooks test`)",
}
FORMATS: Final = ("json", "slack")
_ICONS: Final = {
    "rollout.rollback": ":rotating_light:",
    "guardrail.failed": ":rotating_light:",
    "offline_gate.failed": ":no_entry:",
    "srm": ":warning:",
    "rl_risk.alarm": ":warning:",
    "rollout.promote": ":tada:",
    "rollout.hold": ":pause_button:",
    "rollout.pause": ":pause_button:",
}


def envelope(event_id: int, stored: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"evt_{event_id}", **stored}


def summary(body: dict[str, Any]) -> str:
    """One line for people: what happened, to what, and why."""
    kind = str(body.get("type", ""))
    data = body.get("data") or {}
    exp = body.get("experiment") or {}
    where = f"`{exp.get('name')}` (route {exp.get('route')})" if exp else ""
    reason = str(data.get("reason") or data.get("message") or "")
    if kind.startswith("rollout."):
        what = f"rollout {kind.split('.', 1)[1]}"
        pct = data.get("stage_percent")
        if pct is not None and kind in ("rollout.start", "rollout.advance"):
            what += f" to {pct:g}%"
    else:
        what = kind.replace("_", " ").replace(".", " ")
    text = f"{_ICONS.get(kind, ':information_source:')} liftgate: {what} {where}".rstrip()
    return f"{text}: {reason}" if reason else text


def render(fmt: str, body: dict[str, Any]) -> bytes:
    if fmt == "slack":
        line = summary(body)
        return orjson.dumps(
            {
                "text": line,
                "blocks": [
                    {"type": "section", "text": {"type": "mrkdwn", "text": line}},
                    {
                        "type": "context",
                        "elements": [{"type": "mrkdwn", "text": f"{body.get('type')} · {body.get('id')}"}],
                    },
                ],
            }
        )
    return orjson.dumps(body)
