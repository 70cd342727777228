"""An experiment, not served: an HTTP/1.1 protocol of our own with an ASGI request cycle, in
place of uvicorn's ``HttpToolsProtocol`` + ``RequestResponseCycle`` (the ``http=`` class uvicorn
documents), to measure what uvicorn's request cycle costs the gateway (bench/gateway/README.md).

It answers what the shared harness sends (content-length and chunked request bodies, JSON
answers through ``serving.protocol.respond``, streams through ASGI ``send``, keep-alive with one
timer per connection, pipelined requests queued, write flow control) and is compatible with
``serving.protocol``'s ``respond`` / ``arrived_body`` / ``disconnection``. It lacks what a served
protocol needs: ``ServingProtocol``'s read deadlines, header limit and staged close, ``Expect:
100-continue``, upgrade refusals, response validation (header bytes, content-length overruns),
access logs. A response head waits for the first body message (uvicorn's wrapper holds it only
to the end of the loop step).

    cd /work/shared/bench/gateway-overhead && ./compare.sh ... \
      --start 'own=cd /work/main && exec .venv/bin/python -m bench.gateway.own_protocol --port 9001 \
               --upstream $UPSTREAM_BASE --kafka 127.0.0.1:19092'
"""

import asyncio
import urllib.parse

import httptools

from serving.protocol import RESPOND, ServingProtocol, _status_line

_ASGI = {"version": "3.0", "spec_version": "2.3"}


class Flag:
    """asyncio.Event's part the cycle uses, a future only while someone waits."""

    __slots__ = ("_set", "_waiter")

    def __init__(self):
        self._set = False
        self._waiter = None

    def is_set(self):
        return self._set

    def set(self):
        self._set = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def clear(self):
        self._set = False

    async def wait(self):
        if self._set:
            return
        w = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await w
        finally:
            self._waiter = None


class Wrapper:
    """What ``serving.protocol.respond`` and the cycle use of the connection's transport."""

    def __init__(self, transport):
        self.t = transport
        self.close = transport.close

    def write_whole(self, data, more=b""):
        if more:
            self.t.writelines((data, more))
        else:
            self.t.write(data)


class Cycle:
    __slots__ = (
        "access_log",
        "body",
        "chunked",
        "default_headers",
        "disconnected",
        "flow",
        "head_only",
        "keep_alive",
        "message_event",
        "more_body",
        "on_response",
        "proto",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(self, proto, scope, keep_alive):
        self.proto = proto
        self.scope = scope
        self.transport = proto._wrapper
        self.flow = proto
        self.body = bytearray()
        self.more_body = True
        self.disconnected = False
        self.keep_alive = keep_alive
        self.response_started = False
        self.response_complete = False
        self.waiting_for_100_continue = False
        self.access_log = False
        self.default_headers = proto.default_headers
        self.message_event = Flag()
        self.on_response = proto.on_response_complete
        self.chunked = False
        self.head_only = scope["method"] == "HEAD"

    async def run(self, app):
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException:
            if not self.response_started:
                self.keep_alive = False
                await self.send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                    }
                )
                await self.send({"type": "http.response.body", "body": b"Internal Server Error"})
            else:
                self.transport.close()
        else:
            if not self.response_complete and not self.disconnected:
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def receive(self):
        if not self.disconnected and not self.response_complete:
            if not self.message_event.is_set():
                await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = bytes(self.body)
        self.body = bytearray()
        self.proto.resume_reading()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message):
        proto = self.proto
        if proto.write_paused and not self.disconnected:
            await proto.drain()
        if self.disconnected:
            return
        t = message["type"]
        if not self.response_started:
            if t != "http.response.start":
                raise RuntimeError(f"Expected 'http.response.start', got {t!r}.")
            self.response_started = True
            parts = [_status_line(message["status"])]
            has_length = False
            for name, value in (*self.default_headers, *message.get("headers", ())):
                name = name.lower()
                if name == b"content-length":
                    has_length = True
                elif name == b"connection" and b"close" in value.lower():
                    self.keep_alive = False
                parts += (name, b": ", value, b"\r\n")
            if not has_length and not self.head_only:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            if not self.keep_alive:
                parts.append(b"connection: close\r\n")
            parts.append(b"\r\n")
            proto._held = b"".join(parts)
            return
        if t != "http.response.body" or self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message {t!r}.")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        held = proto._held
        proto._held = None
        if self.head_only:
            out = held or b""
        elif self.chunked:
            out = (
                (held or b"")
                + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"")
                + (b"" if more else b"0\r\n\r\n")
            )
        else:
            out = (held or b"") + body
        if out:
            proto._raw.write(out)
        if not more:
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


def _nothing():
    pass


class OwnProtocol(asyncio.Protocol):
    def __init__(self, config, server_state, app_state, _loop=None):
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.app_state = app_state
        self.default_headers = server_state.default_headers
        self.timeout_keep_alive = config.timeout_keep_alive
        self.root_path = config.root_path
        self.parser = httptools.HttpRequestParser(self)
        self.cycle = None
        self.pipeline = []
        self.write_paused = False
        self._drain = None
        self._held = None
        self._idle_since = None
        self._keep_alive = None
        self.scope = None

    def connection_made(self, transport):
        self.connections.add(self)
        self._raw = transport
        self._wrapper = Wrapper(transport)
        self.transport = self._wrapper
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self.server = (sock[0], sock[1]) if isinstance(sock, tuple) else None

    def connection_lost(self, exc):
        self.connections.discard(self)
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None
        c = self.cycle
        if c is not None:
            if not c.response_complete:
                c.disconnected = True
            c.message_event.set()
        self.resume_writing()
        if self.scope is not None:
            self.scope.pop(RESPOND, None)
        self.parser = None

    def data_received(self, data):
        self._idle_since = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._raw.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self._raw.close()
        except httptools.HttpParserUpgrade:
            self._raw.close()

    def eof_received(self):
        pass

    # parser callbacks
    def on_message_begin(self):
        self.url = b""
        self.headers = []
        self.scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        self.headers.append((name.lower(), value))

    def on_headers_complete(self):
        parser = self.parser
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        http_version = parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        url = self.url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url and b"#" not in url:
            raw_path, path, query = url, url.decode("ascii"), b""
        else:
            parsed = httptools.parse_url(url)
            raw_path = parsed.path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            query = parsed.query or b""
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = query
        scope[RESPOND] = self
        existing = self.cycle
        cycle = self.cycle = Cycle(self, scope, http_version != "1.0" and parser.should_keep_alive())
        if existing is None or existing.response_complete:
            self._start(cycle)
        else:
            self._raw.pause_reading()
            self.pipeline.append(cycle)

    def _start(self, cycle):
        task = self.loop.create_task(cycle.run(self.app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body):
        c = self.cycle
        if c.response_complete:
            return
        c.body += body
        if len(c.body) > 65536:
            self._raw.pause_reading()
        c.message_event.set()

    def on_message_complete(self):
        c = self.cycle
        if c.response_complete:
            return
        c.more_body = False
        c.message_event.set()

    def resume_reading(self):
        self._raw.resume_reading()

    def on_response_complete(self):
        self.server_state.total_requests += 1
        if self._raw.is_closing():
            return
        if self.pipeline:
            self._start(self.pipeline.pop(0))
            return
        self._raw.resume_reading()
        self._idle_since = self.loop.time()
        if self._keep_alive is None:
            self._keep_alive = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    _keep_alive_due = ServingProtocol._keep_alive_due  # the one timer's logic, shared

    def timeout_keep_alive_handler(self):
        if not self._raw.is_closing():
            self._raw.close()

    # flow control
    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)
        self._drain = None

    async def drain(self):
        if self._drain is None:
            self._drain = self.loop.create_future()
        await self._drain

    def shutdown(self):
        if self.cycle is None or self.cycle.response_complete:
            self._raw.close()
        else:
            self.cycle.keep_alive = False


def main() -> None:
    """``bench.gateway.serve`` (same arguments) served with :class:`OwnProtocol`."""
    import bench.gateway.serve as serve
    from gateway import server

    served = server.uvicorn_options

    def options(settings):  # type: ignore[no-untyped-def]
        return {**served(settings), "http": OwnProtocol}

    serve.uvicorn_options = options  # type: ignore[assignment]
    serve.main()


if __name__ == "__main__":
    main()
