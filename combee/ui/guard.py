"""What ``combee ui`` checks of a request before a handler runs, and the headers every answer carries. Pure.

**Host allow-list (DNS rebinding).** A page on ``http://attacker.example`` whose name the attacker re-points at
127.0.0.1 can have a browser read ``/api/*`` as its own origin; the browser then sends ``Host:
attacker.example``. So a request is answered only when its Host names the server: ``localhost``, an IP address
written as such (a rebinding attack needs a name it controls; a browser sends an address only when that address
was typed, i.e. the server's own origin), the name the server was bound to, or a name the operator allows
(``--allow-host``, ``COMBEE_UI_ALLOWED_HOSTS``). The port is not checked.

**Headers.** The pages load nothing but their one inline ``<style>`` (no script, image, font or frame), so the
policy allows exactly that stylesheet, by its hash, and forms that submit to the page itself.
"""

from __future__ import annotations

import hashlib
import ipaddress
from base64 import b64encode
from collections.abc import Iterable

__all__ = ["HostCheck", "host_name", "security_headers"]

_LOCAL_NAMES = ("localhost",)


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header without its port, lower-cased, brackets and a trailing dot removed
    (``[::1]:8765`` → ``::1``, ``LocalHost.:80`` → ``localhost``); None when the header is empty or malformed."""
    text = header.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1 :] and not text[end + 1 :].startswith(":")):
            return None
        name = text[1:end]
    else:
        name = text.rsplit(":", 1)[0] if text.count(":") == 1 else text
        if ":" in name:  # an unbracketed IPv6 address is not a valid Host
            return None
    name = name.rstrip(".")
    return name or None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """Which ``Host`` headers the server answers: ``localhost``, any IP address, ``bound`` (the address or name
    the server listens on) and ``extra`` names (case-insensitive, no port)."""

    def __init__(self, bound: str | None = None, extra: Iterable[str] = ()) -> None:
        names = [*_LOCAL_NAMES, *extra, *([bound] if bound else [])]
        self.names = frozenset(n for n in (host_name(f"[{x}]" if ":" in x else x) for x in names) if n)

    def allows(self, header: str | None) -> bool:
        """True when ``header`` (the request's ``Host``, None when absent) names this server."""
        name = host_name(header) if header else None
        return name is not None and (name in self.names or _is_address(name))

    def refusal(self, header: str | None) -> str:
        """The one-line answer to a refused Host: what was refused and how an operator allows a name."""
        if not header:
            return "combee ui: the request has no Host header"
        return (
            f"combee ui: Host {header[:200]!r} is not a name of this server (allowed: an IP address, "
            f"{', '.join(sorted(self.names))}); to reach the page by this name, start it with "
            "--allow-host NAME or COMBEE_UI_ALLOWED_HOSTS"
        )


def _style_hash(style: str) -> str:
    return "sha256-" + b64encode(hashlib.sha256(style.encode()).digest()).decode()


def security_headers(inline_style: str) -> dict[str, str]:
    """The headers of every answer: a Content-Security-Policy that allows ``inline_style`` (the text of the
    pages' one ``<style>`` element) and nothing else to load, no framing, no MIME sniffing, no referrer."""
    policy = "; ".join(
        (
            "default-src 'none'",
            f"style-src '{_style_hash(inline_style)}'",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        )
    )
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Resource-Policy": "same-origin",
    }
