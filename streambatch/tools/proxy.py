"""A TCP proxy on loopback that delays, drops or refuses HTTP requests: what remote reading is tested and measured through.

``LoopbackProxy(port, delay=0.02)`` forwards ``127.0.0.1:proxy.port`` to
``127.0.0.1:port`` and holds back the first byte of every response until
*delay* seconds after its request arrived (a link's latency).  *fault*, called
with each request's number and first line, may answer ``"503"`` (a canned
``503 Slow Down``), ``"drop"`` (the connection is closed unanswered) or
``"stall"`` (no answer until the client gives up), ``"flip"`` (the response's
first body byte inverted: damage in transit), or bytes: a whole raw
response sent instead of the server's (a hostile server: a lying
``Content-Length``, a changed body), the connection closed after it.  Only
loopback addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable
from typing import Any

_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")
_SLOW_DOWN = b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
Fault = Callable[[int, str], "str | bytes | None"]


class LoopbackProxy:
    """Forward a loopback port to another, adding *delay* to each response's first byte and the faults *fault* asks for."""

    def __init__(self, port: int, *, delay: float = 0.0, fault: Fault | None = None) -> None:
        self.target, self.delay, self.fault = port, delay, fault
        self.requests = 0
        self.bytes = 0  # response bytes forwarded (headers too)
        self.body_bytes = 0  # response bodies announced (Content-Length of each response)
        self.waiting = 0  # requests forwarded whose response has not begun ...
        self.peak_waiting = 0  # ... and the most of them at once (requests in flight)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopback-proxy", daemon=True)

    def __enter__(self) -> LoopbackProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        if self._server is not None:  # no new connection from here on
            self._server.close()
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for task in tasks:  # and those a connection accepted just before started, in the next round
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the endpoint to give a client."""
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        server = self._server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=512))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        asked: list[Any] = [0.0, False, False, False]  # latest request: when it came, response begun, a HEAD, flip
        done = asyncio.Event()

        async def upstream() -> None:
            while data := await reader.read(1 << 16):
                if data.startswith(_METHODS):
                    self.requests += 1
                    action = self.fault(self.requests, data.split(b"\r\n", 1)[0].decode(errors="replace")) if self.fault else None
                    if action == "503":
                        writer.write(_SLOW_DOWN)
                        await writer.drain()
                        break
                    if action == "drop":
                        break
                    if isinstance(action, bytes):
                        writer.write(action)
                        await writer.drain()
                        break
                    if action == "stall":
                        await asyncio.sleep(3600)
                    asked[0], asked[1], asked[2] = time.perf_counter(), False, data.startswith(b"HEAD ")
                    asked[3] = action == "flip"
                    self.waiting += 1
                    self.peak_waiting = max(self.peak_waiting, self.waiting)
                up_writer.write(data)
                await up_writer.drain()
            done.set()

        async def downstream() -> None:
            while data := await up_reader.read(1 << 16):
                if not asked[1]:
                    asked[1] = True
                    self.waiting -= 1
                    found = _LENGTH.search(data.split(b"\r\n\r\n", 1)[0])
                    self.body_bytes += int(found.group(1)) if found and not asked[2] else 0
                    wait = asked[0] + self.delay - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                if asked[3]:  # the first body byte, inverted (its headers may end in an earlier chunk)
                    at = 0 if asked[3] == "body" else data.find(b"\r\n\r\n") + 4
                    if at >= 4 or asked[3] == "body":
                        if at < len(data):
                            data, asked[3] = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :], False
                        else:
                            asked[3] = "body"
                self.bytes += len(data)
                writer.write(data)
                await writer.drain()
            done.set()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(Exception):
            await done.wait()
        if asked[0] and not asked[1]:  # closed before its response began
            self.waiting -= 1
        for task in tasks:
            task.cancel()
        for stream in (writer, up_writer):
            with contextlib.suppress(Exception):
                stream.close()
