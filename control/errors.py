"""The control plane's refusal: an HTTP status and a reason, whoever called."""

from __future__ import annotations

from fastapi import HTTPException


class ControlError(HTTPException):
    """A change that cannot be made: ``status_code`` (404 unknown, 409 wrong state or a
    conflict, 422 invalid) and ``detail`` (the reason, safe to show: never a secret)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, detail, headers)

    @property
    def status(self) -> int:
        return self.status_code

    @property
    def reason(self) -> str:
        return str(self.detail)
