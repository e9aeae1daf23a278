"""What one server lets a client hold: bytes, connections and time. Every field is a ``tripy-build serve`` option."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ConfigError


@dataclass(frozen=True)
class Limits:
    """The bounds a server enforces on its clients; the defaults suit one host behind a proxy or none.

    Memory: a JSON body costs several times its size once parsed (a Python object per number), so JSON bodies
    are capped far below binary ones (``Inference-Header-Content-Length``), whose tensors are read in place.
    Everything a connection can hold is bounded by ``max_connections`` times these caps, and the bodies held
    at once by ``max_buffered_bytes``.
    """

    # The largest request body with binary tensor data, in bytes (after gzip is undone); larger ones get 413.
    max_body_bytes: int = 256 << 20
    # The largest request body that is all JSON, in bytes (after gzip is undone); larger ones get 413.
    max_json_bytes: int = 16 << 20
    # Request bodies held at once, summed over every connection; a request beyond it gets 503 and Retry-After.
    max_buffered_bytes: int = 1 << 30
    # The request line and headers of one request, in bytes; longer ones get 431 (a path over 8 KiB: 414).
    max_header_bytes: int = 64 << 10
    # Open connections; one more is answered 503 and closed at once.
    max_connections: int = 512
    # Seconds a request may take to arrive, from its first byte to its body's last; then 408 and closed.
    read_timeout: float = 30.0
    # Seconds a connection may wait with no request (a new one, or between keep-alive requests); then closed.
    idle_timeout: float = 15.0
    # Seconds a stopping server (SIGTERM) waits for requests in flight before it cuts them.
    drain_timeout: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind = int if f.type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
                    kind is int and int(value) != value):
                raise ConfigError(f"{f.name.replace('_', '-')}: must be a positive {'integer' if kind is int else 'number'}"
                                  f", got {value!r}.")
        if self.max_json_bytes > self.max_body_bytes:
            raise ConfigError(f"max-json-bytes ({self.max_json_bytes}) exceeds max-body-bytes ({self.max_body_bytes}); "
                              "a JSON body may be at most as large as any body.")
        if self.max_body_bytes > self.max_buffered_bytes:
            raise ConfigError(f"max-body-bytes ({self.max_body_bytes}) exceeds max-buffered-bytes "
                              f"({self.max_buffered_bytes}): one request could never be held.")
