"""The significance dashboard: static pages served by the analytics service under ``/dashboard``.

Every number on the pages comes from the report API (``/api/experiments``,
``/api/experiments/{id_or_name}/report``, ``/api/experiments/{id_or_name}/rollout``); the
browser polls it and redraws in place. All assets, including the vendored chart library
(Chart.js, see ``static/vendor/VERSIONS.txt``), ship inside the package: nothing is
fetched from a CDN. Use ``mount(app)`` or include ``router`` in the service's app.
"""

from __future__ import annotations

from analytics.web.pages import STATIC_DIR, mount, router

__all__ = ["STATIC_DIR", "mount", "router"]
