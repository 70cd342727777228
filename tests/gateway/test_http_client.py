"""The hot path's HTTP/1.1 client against real TCP servers: keep-alive reuse, retry, limits, errors."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http_client import HttpPool, UpstreamError

BODY = b'{"ok":true}'
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


class Server:
    """A real TCP server; ``close_after`` closes each connection after that many responses."""

    def __init__(self, close_after: int = 0, delay: float = 0.0) -> None:
        self.close_after = close_after
        self.delay = delay
        self.connections = 0
        self.active = 0
        self.max_active = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                if self.delay:
                    await asyncio.sleep(self.delay)
                self.active -= 1
                writer.write(RESPONSE)
                await writer.drain()
                served += 1
                if self.close_after and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def test_connections_are_reused() -> None:
    srv = Server()
    async with srv as url:
        pool = HttpPool(url, limit=4)
        head = pool.head("/chat/completions", {"Content-Type": "application/json"})
        for _ in range(5):
            assert await pool.post(head, b"{}", 5.0) == (200, BODY)
        assert srv.connections == 1
        await pool.close()


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    srv = Server(close_after=1)
    async with srv as url:
        pool = HttpPool(url, limit=4)
        head = pool.head("/completions", {})
        for _ in range(3):
            assert await pool.post(head, b"{}", 5.0) == (200, BODY)
            await asyncio.sleep(0.05)  # the server has closed the idle connection by now
        assert srv.requests == 3
        await pool.close()


async def test_the_pool_never_exceeds_its_connection_limit() -> None:
    srv = Server(delay=0.05)
    async with srv as url:
        pool = HttpPool(url, limit=2)
        head = pool.head("/chat/completions", {})
        results = await asyncio.gather(*(pool.post(head, b"{}", 5.0) for _ in range(8)))
        assert all(r == (200, BODY) for r in results)
        assert srv.max_active <= 2 and srv.connections <= 2
        await pool.close()


async def test_errors_are_classified() -> None:
    srv = Server(delay=2.0)
    async with srv as url:
        pool = HttpPool(url, limit=2)
        with pytest.raises(UpstreamError) as exc:
            await pool.post(pool.head("/x", {}), b"{}", 0.2)
        assert exc.value.kind == "timeout"
        await pool.close()
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = HttpPool(f"http://127.0.0.1:{port}/v1", connect_timeout=1.0)
    with pytest.raises(UpstreamError) as exc:
        await pool.post(pool.head("/x", {}), b"{}", 1.0)
    assert exc.value.kind == "connect"


async def test_upstream_api_key_is_sent_as_bearer_and_model_is_rewritten() -> None:
    from gateway.snapshot import UpstreamConfig
    from gateway.upstreams import make_client

    heads: list[bytes] = []
    bodies: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        heads.append(head)
        bodies.append(await reader.readexactly(length))
        writer.write(RESPONSE)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = make_client(UpstreamConfig("u", f"http://127.0.0.1:{port}", api_key="sk-upstream-9"))
    status, _ = await client.http.post(client.heads["chat"], b'{"model":"served","x":1}', 5.0)
    assert status == 200
    assert heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer sk-upstream-9\r\n" in heads[0]
    assert bodies[0] == b'{"model":"served","x":1}'
    await client.http.close()
    await client.session.close()
    server.close()


async def test_each_call_on_a_kept_alive_connection_is_bounded_by_its_own_timeout() -> None:
    """One timer serves a connection's calls: a call with a longer timeout than the one before
    it is not cut off at the earlier call's deadline, and a shorter one is cut off at its own."""
    srv = Server(delay=0.4)
    async with srv as url:
        pool = HttpPool(url, limit=1)
        head = pool.head("/chat/completions", {})
        assert await pool.post(head, b"{}", 0.6) == (200, BODY)
        # The first call's timer would fire 0.2 s into this call: the call goes on to its answer.
        assert await pool.post(head, b"{}", 5.0) == (200, BODY)
        assert srv.connections == 1
        started = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamError) as err:
            await pool.post(head, b"{}", 0.1)
        assert err.value.kind == "timeout"
        assert asyncio.get_running_loop().time() - started < 0.35  # its own deadline, not 5 s
        await pool.close()
