"""Staged rollouts: plan, controller (ramp / hold / roll back / promote on evidence), manual control.

See ``docs/rollouts.md``. Modules: :mod:`.plan` (the JSON plan and its validation),
:mod:`.evidence` (always-valid guardrail tests, SRM), :mod:`.decisions` (pure policy),
:mod:`.store` (locking, weights, decisions in PostgreSQL), :mod:`.controller` (the loop),
:mod:`.manual` (operator actions), :mod:`.api` (HTTP), :mod:`.service` (wiring).
"""
