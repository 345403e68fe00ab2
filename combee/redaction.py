"""Keeping secrets out of what Combee says: every redaction rule, in one place (pure, standard library only).

Three shapes, each for its own purpose (their outputs are relied on, so they are kept apart rather than merged):
:func:`redact` masks known secrets, URL passwords and credential query parameters anywhere in a text (error
messages); :func:`redact_url` masks a URL's password and credential query parameters and keeps the rest
(endpoints printed); :func:`endpoint_url` drops user-info, query and fragment altogether (the LLM client's logs
and errors, and endpoints written to result files). :func:`strip_query` drops only the query and fragment.
:func:`url_secrets` lists the secrets a URL carries, for callers that mask them in texts of their own.

Two shapes of secret are easy to miss and handled here: a password holding an unencoded ``@`` (the user-info
ends at the *last* ``@`` before the path) and a password given as a query parameter (``?password=``, as
redis-py accepts). Known secrets are replaced longest first, so a secret that contains another is never left
half-shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["QUERY_CREDENTIALS", "URL_CREDENTIALS", "endpoint_url", "redact", "redact_url", "strip_query", "url_secrets"]

URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<creds>[^/\s]+)@")
"""The user-info of a URL anywhere in a text (``scheme://`` then ``user:password@`` or ``token@``), up to the last
``@`` before the path, so a password with an unencoded ``@`` is taken whole."""

_SECRET_WORDS = r"password|passwd|pwd|pass|secret|token|key|apikey|auth|authorization|signature|sig|credentials?"
QUERY_CREDENTIALS = re.compile(
    rf"(?P<name>[?&;](?:[A-Za-z0-9]+[_.-])*(?:{_SECRET_WORDS})(?:[_.-][A-Za-z0-9]+)*=)(?P<value>[^&#\s]*)",
    re.IGNORECASE,
)
"""A query parameter whose name says it holds a credential (``password=``, ``api_key=``, ``access_token=``, ...)."""

MASK = "***"


def _mask_creds(m: re.Match[str]) -> str:
    creds = m.group("creds")
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return f"{m.group('scheme')}{user}:{MASK}@" if user else f"{m.group('scheme')}{MASK}@"


def _mask_query(text: str) -> str:
    return QUERY_CREDENTIALS.sub(lambda m: f"{m.group('name')}{MASK}" if m.group("value") else m.group(0), text)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every non-empty ``secret`` (longest first), every URL password (``scheme://user:pw@``) and
    every credential query parameter (``?password=...``) masked as ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _mask_query(URL_CREDENTIALS.sub(_mask_creds, text))


def _split_authority(url: str) -> tuple[str, str, str, str] | None:
    """``(scheme, creds, host, rest)`` of a URL with user-info (``creds`` up to the last ``@`` before the path)."""
    if "://" not in url:
        return None
    scheme, after = url.split("://", 1)
    end = min((i for i in (after.find("/"), after.find("?"), after.find("#")) if i >= 0), default=len(after))
    # An unencoded "/" or "?" in the password would end the authority early: then the last "@" before the path
    # decides instead (a path, query or fragment of a connection URL has no "@" of its own).
    at = after.rfind("@", 0, end) if "@" in after[:end] else after.split("/", 1)[0].rfind("@")
    if at < 0:
        return None
    rest_at = next((i for i in range(at, len(after)) if after[i] in "/?#"), len(after))
    return scheme, after[:at], after[at + 1 : rest_at], after[rest_at:]


def redact_url(url: str) -> str:
    """``url`` with any password (``scheme://user:password@host``) and credential query parameter replaced by
    ``***``; everything else kept."""
    parts = _split_authority(url)
    if parts is not None:
        scheme, creds, host, rest = parts
        user = creds.split(":", 1)[0]
        url = f"{scheme}://{user}:{MASK}@{host}{rest}" if ":" in creds else f"{scheme}://{MASK}@{host}{rest}"
    return _mask_query(url)


def url_secrets(url: str) -> tuple[str, ...]:
    """Every secret ``url`` carries, as written and percent-decoded: the user-info's password and the values of
    credential query parameters. (A user name alone is not listed: masking it in every text helps no one.)"""
    found: list[str] = []
    parts = _split_authority(url)
    if parts is not None and ":" in parts[1]:
        found.append(parts[1].split(":", 1)[1])
    found.extend(m.group("value") for m in QUERY_CREDENTIALS.finditer(url))
    return tuple(dict.fromkeys(s for raw in found for s in (raw, unquote(raw)) if s))


def endpoint_url(url: str) -> str:
    """``url`` without user-info, query or fragment: safe to put in logs, error messages and result files."""
    parts = _split_authority(url)
    if parts is not None:  # before urlsplit, which would cut a password holding "?" or "#" in two
        url = f"{parts[0]}://{parts[2]}{parts[3]}"
    split = urlsplit(url)
    return urlunsplit((split.scheme, split.netloc.rpartition("@")[2], split.path, "", ""))


def strip_query(url: str) -> str:
    """``url`` without its query and fragment (user-info kept: redact it separately)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
