"""What one server lets a client hold: bytes, connections and time. Every field is a ``tripy-build serve`` option.

The connection bound is set by what the host can hold unless it is given: an idle connection costs the server
~6.5 KiB of memory (measured: 10,000 idle connections, +65 MB RSS; their sockets hold no buffers) and a file
descriptor, so the default is as many as the process's file limit allows (``RLIMIT_NOFILE``, its soft limit
raised to the hard limit where it is lower: 1,024 is a common soft limit, far below what an asyncio server
holds), less the files open now and ``FILE_HEADROOM`` for those the server opens later, and at most what fits
in a sixteenth of the memory (the host's, or its cgroup's limit) at ``CONNECTION_BYTES`` each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from ..errors import ConfigError

# What one idle connection is budgeted, in bytes: ~6.5 KiB measured in the server process, the kernel's socket
# beside it, and margin. Idle connections may take a sixteenth of the memory.
CONNECTION_BYTES = 16 << 10
MEMORY_SHARE = 16
# File descriptors kept for what the server opens besides connections (gRPC's sockets, files read, pipes).
FILE_HEADROOM = 256


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
    # Open connections; past it, the connection idle the longest (no request in flight, nothing buffered) is
    # closed to make room for a new one, which is answered 503 (and closed) only where none is idle. None: set
    # by the file limit and the memory when a server starts (``resolved``).
    max_connections: int | None = None
    # Seconds a request may take to arrive, from its first byte to its body's last; then 408 and closed.
    read_timeout: float = 30.0
    # Seconds a connection may wait with no request (a new one, or between keep-alive requests); then closed.
    idle_timeout: float = 15.0
    # Seconds a stopping server (SIGTERM) waits for requests in flight before it cuts them.
    drain_timeout: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "max_connections":
                continue
            kind = int if "int" in str(f.type) else float
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

    def resolved(self) -> "Limits":
        """These limits as a server starting now enforces them: the file limit raised to its hard limit where it is
        lower, and ``max_connections`` set by it and the memory where it is None, or checked against it where given.

        Raises:
            ConfigError: ``max_connections`` is more than the file limit leaves room for, or the file limit
                leaves room for none.
        """
        soft, hard = raise_file_limit()
        in_use = open_files()
        allowed = None if soft is None else soft - in_use - FILE_HEADROOM
        fix = (f"raise the process's file limit (ulimit -n; its hard limit is {hard}, which only root can raise)"
               if soft is not None else "")
        if allowed is not None and allowed < 1:
            raise ConfigError(f"the process may open {soft} files (RLIMIT_NOFILE), {in_use} are open and "
                              f"{FILE_HEADROOM} are kept for the server's own: no room for a connection; {fix}.")
        if self.max_connections is None:
            memory = memory_bytes()
            bounds = [b for b in (allowed, memory // MEMORY_SHARE // CONNECTION_BYTES if memory else None) if b]
            return replace(self, max_connections=max(1, min(bounds)) if bounds else 4096)
        if allowed is not None and self.max_connections > allowed:
            raise ConfigError(f"max-connections {self.max_connections} is more than this process can open: its file "
                              f"limit (RLIMIT_NOFILE) is {soft}, {in_use} files are open and {FILE_HEADROOM} are kept "
                              f"for the server's own, which leaves {allowed}; give at most {allowed}, leave it out (the "
                              f"default is what the limit allows), or {fix}.")
        return self


def raise_file_limit() -> tuple[int | None, int | None]:
    """RLIMIT_NOFILE's soft limit raised to its hard limit where that is allowed (else as far as the OS lets it go);
    (soft, hard) after, None where there is no limit (or no ``resource`` module: Windows)."""
    try:
        import resource
    except ImportError:
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and (hard == unlimited or soft < hard):
        for want in (hard, _nr_open(), 1 << 20, 65536, 10240):  # macOS refuses more than OPEN_MAX (10240)
            if want == unlimited or want is None or want <= soft or (hard != unlimited and want > hard):
                continue
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            except (ValueError, OSError):
                continue
            soft = want
            break
    return (None if soft == unlimited else soft), (None if hard == unlimited else hard)


def _nr_open() -> int | None:
    """The most files Linux lets a process have (``/proc/sys/fs/nr_open``)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def open_files() -> int:
    """File descriptors this process has open now (64 where it cannot say)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 64


def memory_bytes() -> int | None:
    """The memory this process may use: the host's, or its cgroup's limit where that is lower (None: unknown)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = int(text) if total is None else min(total, int(text))
        break
    return total
