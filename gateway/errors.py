"""OpenAI-shaped error bodies (``{"error": {"message", "type", "param", "code"}}``)."""

from __future__ import annotations

import orjson


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None) -> tuple[int, bytes]:
    return 400, error_body(message, "invalid_request_error", "invalid_request", param)


def model_not_found(model: object) -> tuple[int, bytes]:
    return 404, error_body(
        f"The model {model!r} does not exist or is not served by this gateway.",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


def unauthorized(message: str = "Missing or invalid API key.") -> tuple[int, bytes]:
    return 401, error_body(message, "invalid_request_error", "invalid_api_key")


def too_large(limit: int) -> tuple[int, bytes]:
    return 413, error_body(
        f"Request body too large (the limit is {limit} bytes).", "invalid_request_error", "body_too_large"
    )


def rate_limited(message: str) -> tuple[int, bytes]:
    return 429, error_body(message, "rate_limit_error", "rate_limit_exceeded")


def upstream_down(upstream: str) -> tuple[int, bytes]:
    return 502, error_body(f"Upstream {upstream!r} is unreachable.", "upstream_error", "upstream_unavailable")


def upstream_timeout(upstream: str) -> tuple[int, bytes]:
    return 504, error_body(f"Upstream {upstream!r} timed out.", "upstream_error", "upstream_timeout")


def upstream_bad_response(upstream: str) -> tuple[int, bytes]:
    return 502, error_body(
        f"Upstream {upstream!r} sent an invalid response.", "upstream_error", "bad_upstream_response"
    )


def upstream_error(status: int, raw: bytes) -> bytes:
    """Re-shape an upstream's error body (vLLM uses ``{"object":"error","message":...}``) as OpenAI's."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return orjson.dumps({"error": {k: err.get(k) for k in ("message", "type", "param", "code")}})
        if isinstance(data.get("message"), str):
            return error_body(data["message"], str(data.get("type") or "upstream_error"), str(status))
    text = raw[:500].decode("utf-8", "replace") or f"upstream answered {status}"
    return error_body(text, "upstream_error", str(status))
