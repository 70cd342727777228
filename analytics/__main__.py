"""``python -m analytics``: the analytics service (report API, dashboard, background workers)."""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError

from analytics.service.app import create_app
from analytics.service.server import serve
from analytics.service.settings import AnalyticsSettings
from contracts import redaction


def main() -> int:
    try:
        settings = AnalyticsSettings()  # read from LIFTGATE_* variables
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        sys.stderr.write(f"analytics: invalid settings ({reasons}); set LIFTGATE_ADMIN_TOKEN etc.\n")
        return 2
    # Before anything logs: no configured secret may reach a log line.
    redaction.install(
        settings.admin_token, settings.read_token, settings.ngram_key, database_url=settings.database_url
    )
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    serve(create_app(settings), settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
