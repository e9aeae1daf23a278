"""The HTTP/1.1 connection: uvicorn's httptools protocol, with the limits ``Limits`` sets on a client.

httptools (Node's llhttp) does the framing and refuses what smuggles requests: two different
``Content-Length`` headers, ``Content-Length`` beside ``Transfer-Encoding``, a length that is not digits.
uvicorn times out a keep-alive connection between requests; this adds what it leaves open: a connection
bound, a deadline for a new connection's first byte, a deadline for a whole request to arrive (a slow
client gets 408), bounds on the request line and headers (414, 431), and JSON bodies for the errors
answered here instead of uvicorn's plain text.

At the connection bound a new connection takes the place of the one idle the longest (no request in
flight, no bytes of one received, nothing left to send), which is closed, as an idle timeout would: 1,000
idle connections (each within its idle timeout) cannot keep a real request out. Only where every
connection is busy is the new one answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..errors import ConfigError
from .limits import Limits

MAX_URL_BYTES = 8 << 10  # a longer request target is answered 414
_REASONS = {400: "Bad Request", 408: "Request Timeout", 414: "URI Too Long", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


def error_bytes(status: int, message: str, extra: bytes = b"") -> bytes:
    """A complete ``Connection: close`` response with a JSON error body, as bytes for a transport."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n").encode() + extra + b"\r\n" + body


class _Refuse(Exception):
    """Raised from a parser callback to stop parsing a request that is answered with ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under ``limits`` (a class attribute: ``for_limits`` makes the class)."""

    limits: Limits
    # called with the status of every answer made here, and {"path": ...} where a request's head was read (the
    # server's metrics: ``Metrics.response``)
    on_answer: Any = None
    on_idle_closed: Any = None  # called when an idle connection is closed to make room (the server's metrics)
    # One server's connections with nothing in flight, the one idle the longest first (a dict as an ordered set),
    # and those closed to make room whose close has not completed (they count no more).
    idle: dict["LimitedProtocol", None]
    making_room: set["LimitedProtocol"]

    @classmethod
    def for_limits(cls, limits: Limits, on_answer: Any = None, on_idle_closed: Any = None) -> type["LimitedProtocol"]:
        """The protocol class of one server (``limits.max_connections`` set: ``Limits.resolved``)."""
        if limits.max_connections is None:
            raise ConfigError("LimitedProtocol.for_limits: limits.max_connections is None; give Limits(...).resolved(), "
                              "which sets it.")
        return type("LimitedProtocol", (cls,), {
            "limits": limits, "on_answer": staticmethod(on_answer or (lambda status, scope: None)),
            "on_idle_closed": staticmethod(on_idle_closed or (lambda: None)), "idle": {}, "making_room": set()})

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._idle: asyncio.TimerHandle | None = None  # a new connection's wait for its first byte
        self._read: asyncio.TimerHandle | None = None  # the current request's deadline to arrive
        self._head_bytes = 0  # bytes received while a request's head is incomplete; -1 while it is not being read
        self._header_bytes = 0  # the current request's headers, as parsed
        self._refusal: _Refuse | None = None
        self._path: str | None = None  # the current request's path, once its head is read
        self._in_message = False  # a request has begun to arrive and has not ended

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) - len(self.making_room) > self.limits.max_connections and not self._make_room():
            return self._answer(503, f"the server holds its maximum of {self.limits.max_connections} connections, "
                                     "each with a request in flight; try again shortly.", b"retry-after: 1\r\n")
        self.idle[self] = None
        self._idle = self.loop.call_later(self.limits.idle_timeout, self.transport.close)

    def _make_room(self) -> bool:
        """Close the connection idle the longest (nothing in flight, nothing left to send); whether there was one."""
        for conn in self.idle:
            if not conn.transport.is_closing() and not conn.transport.get_write_buffer_size():
                break
        else:
            return False
        del self.idle[conn]
        self.making_room.add(conn)
        conn._disarm()
        conn.transport.close()
        self.on_idle_closed()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle.pop(self, None)
        self.making_room.discard(self)
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.idle.pop(self, None)  # busy: a request is arriving
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._head_bytes >= 0:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrades here: the request is answered as it is
        except httptools.HttpParserError as e:
            refusal, self._refusal = self._refusal, None
            if refusal is not None:
                return self._answer(refusal.status, str(refusal))
            return self._answer(400, f"the request is not valid HTTP/1.1: {str(e) or type(e).__name__}.")
        if self._head_bytes > self.limits.max_header_bytes:
            self._answer(431, f"the request line and headers exceed {self.limits.max_header_bytes} bytes.")

    def on_message_begin(self) -> None:
        self._in_message = True
        super().on_message_begin()
        self._header_bytes = 0
        self._path = None
        self._disarm()
        self._read = self.loop.call_later(
            self.limits.read_timeout, self._answer, 408,
            f"the request did not arrive within the read timeout ({self.limits.read_timeout:g} s).")

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            self._refusal = _Refuse(414, f"the request target exceeds {MAX_URL_BYTES} bytes.")
            raise self._refusal

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes + len(self.url) > self.limits.max_header_bytes:
            self._refusal = _Refuse(431, f"the request line and headers exceed {self.limits.max_header_bytes} bytes.")
            raise self._refusal

    def on_headers_complete(self) -> None:
        self._head_bytes = -1
        super().on_headers_complete()
        self._path = self.scope.get("path")

    def on_message_complete(self) -> None:
        self._in_message = False
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._head_bytes = 0
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and not self._in_message:
            self.idle.pop(self, None)
            self.idle[self] = None  # idle again, the newest of the idle: kept the longest

    def send_400_response(self, msg: str) -> None:
        self._answer(400, msg)

    def _answer(self, status: int, message: str, extra: bytes = b"") -> None:
        """Answer ``status`` with a JSON error unless a response has begun, and close the connection."""
        self._disarm()
        self.on_answer(status, {"path": self._path} if self._path else None)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            started = cycle.response_started
            cycle.disconnected = True  # the application's receive() now says so, and its send() does nothing
            cycle.message_event.set()
            if started:
                self.transport.close()
                return
        if not self.transport.is_closing():
            self.transport.write(error_bytes(status, message, extra))
            self.transport.close()

    def _disarm(self) -> None:
        for timer in (self._idle, self._read):
            if timer is not None:
                timer.cancel()
        self._idle = self._read = None
