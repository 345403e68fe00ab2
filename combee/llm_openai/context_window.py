"""A model's context window, as the server reports it (llama.cpp's ``/props``, vLLM's ``/v1/models``)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

__all__ = ["context_from_models", "context_from_props", "server_root", "slots_from_props"]


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_from_props(body: object) -> int | None:
    """The per-slot context in llama.cpp's ``/props`` answer (``default_generation_settings.n_ctx``), or None."""
    if isinstance(body, Mapping):
        settings = body.get("default_generation_settings")
        if isinstance(settings, Mapping):
            return _positive_int(settings.get("n_ctx"))
    return None


def slots_from_props(body: object) -> int | None:
    """The server's parallel slots in llama.cpp's ``/props`` answer (``total_slots``), or None."""
    return _positive_int(body.get("total_slots")) if isinstance(body, Mapping) else None


def context_from_models(body: object, model: str) -> int | None:
    """The context of ``model`` in a ``/models`` answer, or None.

    vLLM says ``max_model_len``; some servers ``context_length``; llama.cpp ``meta.n_ctx`` (the context it
    runs with). ``meta.n_ctx_train`` is the *training* context, not what a request may use, so it is ignored.
    """
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        return None
    entries = [e for e in data if isinstance(e, Mapping)]
    named = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in named:
        for key in ("max_model_len", "context_length", "context_window"):
            if (value := _positive_int(entry.get(key))) is not None:
                return value
        meta = entry.get("meta")
        if isinstance(meta, Mapping) and (value := _positive_int(meta.get("n_ctx"))) is not None:
            return value
    return None


def server_root(base_url: str) -> str:
    """``base_url`` without its API prefix (``/v1``): where llama.cpp serves ``/props``."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))
