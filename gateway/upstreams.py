"""One pooled aiohttp ClientSession per upstream, created in the lifespan and kept in sync with the snapshot."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from yarl import URL

from contracts.config_rules import key_problem, url_problem
from gateway.http_client import HttpPool
from gateway.snapshot import UpstreamConfig

log = logging.getLogger(__name__)

ENDPOINT_PATHS = {"chat": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings"}


@dataclass(slots=True)
class UpstreamClient:
    config: UpstreamConfig
    session: aiohttp.ClientSession
    urls: Mapping[str, URL]
    headers: Mapping[str, str]
    http: HttpPool  # the hot path's client
    heads: Mapping[str, bytes]  # pre-rendered request heads per endpoint


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def make_client(cfg: UpstreamConfig) -> UpstreamClient:
    """The client of one upstream; ValueError (with a reason that never quotes the key) when
    the config cannot be used — checked before anything is opened."""
    problem = url_problem(cfg.base_url) or (key_problem(cfg.api_key) if cfg.api_key else None)
    if problem is not None:
        raise ValueError(problem)
    connector = aiohttp.TCPConnector(limit=4, ttl_dns_cache=300)
    # aiohttp only serves readiness probes; completions go through the lean HttpPool.
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    )
    base = _base(cfg.base_url)
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    http = HttpPool(base, limit=cfg.max_connections, connect_timeout=cfg.connect_timeout_s)
    return UpstreamClient(
        config=cfg,
        session=session,
        urls={k: URL(base + p) for k, p in ENDPOINT_PATHS.items()} | {"models": URL(base + "/models")},
        headers=headers,
        http=http,
        heads={k: http.head(p, headers) for k, p in ENDPOINT_PATHS.items()},
    )


class UpstreamPool:
    """Maps upstream name -> client; ``sync`` opens sessions for new/changed upstreams and closes old ones.

    One upstream whose new config cannot be used never stops the others from being synced:
    it keeps its previous client (if it had one: last known good), and ``errors`` says why,
    until a later ``sync`` succeeds.
    """

    def __init__(self) -> None:
        self.clients: dict[str, UpstreamClient] = {}
        self.errors: dict[str, str] = {}  # upstream -> why its current config is not applied
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: list[UpstreamClient] = []

    def sync(self, upstreams: Mapping[str, UpstreamConfig]) -> dict[str, str]:
        """Apply ``upstreams``; returns (and keeps in ``errors``) the ones that could not be."""
        errors: dict[str, str] = {}
        for name, cfg in upstreams.items():
            cur = self.clients.get(name)
            if cur is not None and cur.config == cfg:
                continue
            try:
                client = make_client(cfg)
            except Exception as exc:  # one bad row must not stop the others
                errors[name] = str(exc) if type(exc) is ValueError else type(exc).__name__
                continue
            self.clients[name] = client
            if cur is not None:
                self._close_later(cur)
        for name in [n for n in self.clients if n not in upstreams]:
            self._close_later(self.clients.pop(name))
        self.errors = errors
        return errors

    def _close_later(self, client: UpstreamClient) -> None:
        self._retired.append(client)

        # In-flight requests may still use the old session: close it after a grace period.
        async def close() -> None:
            await asyncio.sleep(client.config.timeout_s + 1)
            await client.session.close()
            await client.http.close()
            self._retired.remove(client)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        for client in [*self.clients.values(), *self._retired]:
            await client.session.close()
            await client.http.close()
        self.clients.clear()
