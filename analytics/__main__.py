"""``python -m analytics``: the analytics service (report API, dashboard, background workers)."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError

from analytics.app import create_app
from analytics.settings import AnalyticsSettings


def main() -> int:
    try:
        settings = AnalyticsSettings()  # read from LIFTGATE_* variables
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        sys.stderr.write(f"analytics: invalid settings ({reasons}); set LIFTGATE_ADMIN_TOKEN etc.\n")
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.analytics_host,
        port=settings.analytics_port,
        log_level=settings.log_level,
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
