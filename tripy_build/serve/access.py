"""Who may talk to a server: the Host it is reached by, the web page a request comes from, a bearer token.

A server on loopback is still reachable from a browser: a web page can POST to ``127.0.0.1`` (a "simple"
cross-origin request needs no preflight), and DNS rebinding points a page's own host name at it so that
the page can read the answers. So a request that names another ``Host`` than the server is known by is
refused (421), and so is a request that carries an ``Origin`` (only browsers send one) not allowed
explicitly (403). With a token file every request but the health probes must carry
``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import CallError, ConfigError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# Open without a token: a load balancer's or Kubernetes' probes carry none.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})


class Refused(CallError):
    """A request answered with ``status`` (and ``headers``) before it reaches a model."""

    def __init__(self, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()):
        super().__init__(message)
        self.status, self.headers = status, list(headers)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: str | Path) -> bytes:
    """The bearer token in a file (surrounding whitespace dropped)."""
    try:
        token = Path(path).read_bytes().strip()
    except OSError as e:
        raise ConfigError(f"token file {str(path)!r}: cannot be read ({e.strerror}); give a file holding the token.") from None
    if not token or any(c < 0x21 or c > 0x7E for c in token):
        raise ConfigError(f"token file {str(path)!r}: must hold one token of printable ASCII without spaces "
                          f"({'it is empty' if not token else 'it has other bytes'}).")
    return token


@dataclass(frozen=True)
class Access:
    """What a request must show. ``hosts``: the Host names accepted (``None``: any); ``origins``: the
    ``Origin`` values accepted; ``token``: the bearer token every request but the health probes needs."""

    hosts: frozenset[str] | None = frozenset(LOOPBACK_NAMES)
    origins: frozenset[str] = frozenset()
    token: bytes | None = None

    @classmethod
    def for_server(cls, bind: str, allowed_hosts: Sequence[str] | None = None, allowed_origins: Sequence[str] = (),
                   token_file: str | Path | None = None) -> "Access":
        """The access of a server bound to ``bind``: by default, a loopback server answers only to loopback
        names, one bound elsewhere to any (name them with ``allowed_hosts`` to close it)."""
        if allowed_hosts is None:
            hosts = frozenset(LOOPBACK_NAMES) if is_loopback(bind) else None
        else:
            names = [h.strip().lower() for h in allowed_hosts if h.strip()]
            if not names:
                raise ConfigError("allowed-hosts: give at least one host name, or '*' for any.")
            hosts = None if "*" in names else frozenset(n.strip("[]") for n in names)
        return cls(hosts, frozenset(o.strip().rstrip("/") for o in allowed_origins if o.strip()),
                   read_token(token_file) if token_file is not None else None)

    def check(self, path: str, headers: Sequence[tuple[bytes, bytes]], http_version: str) -> None:
        """Raise ``Refused`` unless a request with these headers may go on to ``path``."""
        host, origin, auth = [], [], []
        for name, value in headers:
            if name == b"host":
                host.append(value)
            elif name == b"origin":
                origin.append(value)
            elif name == b"authorization":
                auth.append(value)
        if len(host) > 1 or (not host and http_version != "1.0"):
            raise Refused(400, f"a request needs exactly one Host header; it has {len(host)}.")
        if self.hosts is not None and host:
            name = _host_name(host[0])
            if name not in self.hosts:
                raise Refused(421, f"Host {host[0].decode('latin-1')[:100]!r} is not a name this server answers to "
                                   f"({', '.join(sorted(self.hosts))}); start it with --allowed-hosts naming it.")
        if origin and origin[0].decode("latin-1").rstrip("/") not in self.origins:
            raise Refused(403, f"requests from web pages are refused (Origin {origin[0].decode('latin-1')[:100]!r}); "
                               "start the server with --allowed-origins naming the page's origin to allow it.")
        if self.token is not None and path not in OPEN_PATHS:
            given = auth[0] if len(auth) == 1 else b""
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.token):
                raise Refused(401, "this server needs 'Authorization: Bearer <token>' "
                                   f"({'the token given is not it' if given else 'none was given'}).",
                              [(b"www-authenticate", b'Bearer realm="tripy_build"')])


def _host_name(value: bytes) -> str:
    """``example.com:8000`` -> ``example.com``; ``[::1]:8000`` -> ``::1``."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text
