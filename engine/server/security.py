"""Who may use the server: the bind rule, the Host and Origin checks, CORS, the API key.

Safe by default: loopback only unless asked (and then with a key); a browser page can neither
read nor drive the server (no CORS headers, a foreign `Origin` or a non-local `Host` refused)
unless its origin is allowed. Every API the server speaks (OpenAI's, Anthropic's, Ollama's)
passes the same checks, on every port it listens on.
"""
from __future__ import annotations

import hmac
import ipaddress
import re
from urllib.parse import urlsplit

from aiohttp import web

from ..api import EngineError
from .errors import ApiError

_HEADER_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(?:\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")
_WEB_SCHEMES = ("http", "https")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, allow_network: bool, api_key: str | None) -> None:
    """Loopback only, unless the user asked for the network and set a key."""
    if is_loopback(host):
        return
    if not allow_network:
        raise EngineError(f"--host {host}: the server binds only to this machine (127.0.0.1) unless "
                          "--allow-network is given: anyone who can reach the port could use the model")
    if not api_key:
        raise EngineError(f"--host {host}: serving on the network needs an API key (--api-key or "
                          "--api-key-env)")


def origin_key(origin: str) -> str:
    """Origins compare without case (scheme and host are case-insensitive; a port is digits)
    and without a trailing slash."""
    return origin.strip().rstrip("/").lower()


class OriginRule:
    """One `--cors-origin` in llama-server's forms: `*` (any page), `localhost` (a page served
    from this machine: localhost, 127.0.0.0/8 or [::1], any scheme and port), an origin
    without a scheme (`example.com:3000`: http or https), or a whole origin (exact)."""

    def __init__(self, text: str):
        self.text = origin_key(text)
        if not self.text:
            raise EngineError("--cors-origin needs an origin (e.g. http://localhost:3000, localhost or *)")
        self.any = self.text == "*"
        self.loopback = self.text == "localhost"
        self.schemeless = not self.any and not self.loopback and "://" not in self.text

    def allows(self, origin: str) -> bool:
        key = origin_key(origin)
        if self.any or key == self.text:
            return True
        try:
            parts = urlsplit(key)
        except ValueError:
            return False
        if parts.scheme not in _WEB_SCHEMES or not parts.hostname:
            return False
        if self.loopback:
            return is_loopback(parts.hostname)
        if self.schemeless:  # the origin as the browser sends it, its scheme left out
            return key.split("://", 1)[1] == self.text
        return False


class Guard:
    """The checks every request passes, in order: Host (DNS rebinding), Origin, a CORS
    preflight answered, then the key (`Authorization: Bearer K` as OpenAI and Ollama clients
    send it, or `x-api-key: K` as Anthropic's do)."""

    def __init__(self, host: str, api_key: str | None, cors_origins: tuple[str, ...] = ()):
        self.rules = tuple(OriginRule(o) for o in cors_origins)
        self._api_key = api_key.encode("utf-8") if api_key else None
        self._check_host = is_loopback(host)

    @property
    def has_key(self) -> bool:
        return self._api_key is not None

    def origin_allowed(self, origin: str) -> bool:
        return any(rule.allows(origin) for rule in self.rules)

    def check(self, request: web.Request, needs_key: bool) -> web.Response | None:
        """Raises ApiError for a refused request; a response for a preflight; else None."""
        if self._check_host and not is_loopback(request.url.host or "localhost"):
            # A page whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends its own Host.
            raise ApiError(403, f"Host {request.host!r}: this server answers only to localhost names")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            raise ApiError(403, f"Origin {origin!r}: requests from web pages are refused unless "
                                "that origin is allowed (--cors-origin)")
        if request.method == "OPTIONS" and origin is not None:  # a CORS preflight
            return web.Response(status=204, headers={
                "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": allowed_headers(request),
                "Access-Control-Max-Age": "600",
                "Vary": "Origin, Access-Control-Request-Headers"})
        if self._api_key is not None and needs_key and not self._key_matches(request):
            raise ApiError(401, "missing or wrong API key: send the header "
                                "'Authorization: Bearer <key>' (or 'x-api-key: <key>')", code="invalid_api_key")
        return None

    def _key_matches(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8"), self._api_key):
            return True
        other = request.headers.get("x-api-key")
        return other is not None and hmac.compare_digest(other.strip().encode("utf-8"), self._api_key)

    def cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and self.origin_allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            if "Vary" not in response.headers:
                response.headers["Vary"] = "Origin"


def allowed_headers(request: web.Request) -> str:
    """A preflight's answer: the headers the page asked for (the OpenAI JS SDK sends its
    x-stainless-* headers, Anthropic's its anthropic-* ones), when they are a well-formed list."""
    asked = request.headers.get("Access-Control-Request-Headers", "").strip()
    if asked and len(asked) <= 4096 and _HEADER_LIST.fullmatch(asked):
        return asked
    return "Authorization, Content-Type, x-api-key"
