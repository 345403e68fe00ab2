"""Keeping secrets out of what Combee says: every redaction rule, in one place (pure, standard library only).

Three shapes, each for its own purpose (their outputs are relied on, so they are kept apart rather than merged):
:func:`redact` masks known secrets and URL passwords anywhere in a text (error messages); :func:`redact_url`
masks a URL's password and keeps the rest (endpoints written to metrics and printed); :func:`endpoint_url`
drops user-info, query and fragment altogether (the LLM client's logs and errors). :func:`strip_query` drops
only the query and fragment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

__all__ = ["URL_CREDENTIALS", "endpoint_url", "redact", "redact_url", "strip_query"]

URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<creds>[^/@\s]+)@")
"""The user-info of a URL anywhere in a text (``scheme://`` then ``user:password@`` or ``token@``)."""


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every ``secret`` (non-empty) and every URL password (``scheme://user:pw@``) masked as ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")

    def mask(m: re.Match[str]) -> str:
        creds = m.group("creds")
        user = creds.split(":", 1)[0] if ":" in creds else ""
        return f"{m.group('scheme')}{user}:***@" if user else f"{m.group('scheme')}***@"

    return URL_CREDENTIALS.sub(mask, text)


def redact_url(url: str) -> str:
    """``url`` with any password (``scheme://user:password@host``) replaced by ``***``."""
    if "://" not in url or "@" not in url.split("://", 1)[1].split("/", 1)[0]:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.split("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://***@{host}"


def endpoint_url(url: str) -> str:
    """``url`` without user-info, query or fragment: safe to put in logs and error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def strip_query(url: str) -> str:
    """``url`` without its query and fragment (user-info kept: redact it separately)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
