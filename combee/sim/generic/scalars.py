"""Generators of scalar JSON values (strings with their formats, integers, numbers) within a schema's bounds."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from combee.sim.generic.answer import SchemaError
from combee.sim.generic.prose import WORDS

__all__ = ["Gen", "int_or_none", "integer_generator", "number_generator", "string_generator"]

Gen = Callable[[random.Random, int], Any]
"""A compiled generator: ``(rng, depth) -> JSON value``."""


def int_or_none(schema: Mapping[str, Any], key: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SchemaError(f"{key} must be a non-negative integer, got {value!r}")
    return int(value)


def string_generator(schema: Mapping[str, Any]) -> Gen:
    min_len = int_or_none(schema, "minLength") or 0
    max_len = int_or_none(schema, "maxLength")
    if max_len is not None and min_len > max_len:
        raise SchemaError("minLength exceeds maxLength")
    fmt = _FORMATS.get(str(schema.get("format", "")))
    hi = max_len if max_len is not None else max(min_len, 48)
    hi = min(hi, max(min_len, 48) + 16)
    lo = max(min_len, min(3, hi))

    def gen_string(rng: random.Random, depth: int) -> Any:
        if fmt is not None:
            text = fmt(rng)
            if min_len <= len(text) and (max_len is None or len(text) <= max_len):
                return text
        length = rng.randint(lo, hi)
        if length == 0:
            return ""
        text = " ".join(rng.choices(WORDS, k=length // 5 + 1))  # words average ~6 characters with a space
        while len(text) < length:
            text += " " + " ".join(rng.choices(WORDS, k=length // 10 + 1))
        boundary = text.rfind(" ", 0, length + 1)  # end on a whole word when minLength allows
        text = text[:boundary] if boundary >= max(min_len, 1) else text[:length]
        return text[:-1] + "s" if text.endswith(" ") else text

    return gen_string


def _fmt_datetime(rng: random.Random) -> str:
    return (
        f"20{rng.randint(10, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
    )


def _fmt_uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


_FORMATS: dict[str, Callable[[random.Random], str]] = {
    "date-time": _fmt_datetime,
    "date": lambda rng: _fmt_datetime(rng)[:10],
    "time": lambda rng: _fmt_datetime(rng)[11:19],
    "email": lambda rng: f"{rng.choice(WORDS)}.{rng.choice(WORDS)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.choice(WORDS)}/{rng.randint(1, 999)}",
    "url": lambda rng: f"https://example.com/{rng.choice(WORDS)}/{rng.randint(1, 999)}",
    "uuid": _fmt_uuid,
}


def _bounds(schema: Mapping[str, Any]) -> tuple[float | None, bool, float | None, bool]:
    """(lower, lower_exclusive, upper, upper_exclusive) from both drafts' spellings."""
    lo: float | None = None
    hi: float | None = None
    lo_ex = hi_ex = False
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    ex_min, ex_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    for value, name in ((minimum, "minimum"), (maximum, "maximum")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise SchemaError(f"{name} must be a number")
    if isinstance(minimum, int | float):
        lo = minimum
        lo_ex = ex_min is True
    if isinstance(ex_min, int | float) and not isinstance(ex_min, bool) and (lo is None or ex_min >= lo):
        lo, lo_ex = ex_min, True
    if isinstance(maximum, int | float):
        hi = maximum
        hi_ex = ex_max is True
    if isinstance(ex_max, int | float) and not isinstance(ex_max, bool) and (hi is None or ex_max <= hi):
        hi, hi_ex = ex_max, True
    return lo, lo_ex, hi, hi_ex


def integer_generator(schema: Mapping[str, Any]) -> Gen:
    lo_f, lo_ex, hi_f, hi_ex = _bounds(schema)
    lo_i = None if lo_f is None else (math.floor(lo_f) + 1 if lo_ex else math.ceil(lo_f))
    hi_i = None if hi_f is None else (math.ceil(hi_f) - 1 if hi_ex else math.floor(hi_f))
    lo = lo_i if lo_i is not None else (0 if hi_i is None else hi_i - 100)
    hi = hi_i if hi_i is not None else lo + 100
    step = schema.get("multipleOf")
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        k_lo, k_hi = -(-lo // step), hi // step
        if k_lo > k_hi:
            raise SchemaError("no multiple of multipleOf within the bounds")
        return lambda rng, depth: rng.randint(k_lo, k_hi) * step
    if lo > hi:
        raise SchemaError("integer bounds admit no value")
    return lambda rng, depth: rng.randint(lo, hi)


def number_generator(schema: Mapping[str, Any]) -> Gen:
    lo_b, lo_ex, hi_b, hi_ex = _bounds(schema)
    lo = lo_b if lo_b is not None else (0.0 if hi_b is None else hi_b - 100.0)
    hi = hi_b if hi_b is not None else lo + 100.0
    if lo > hi or (lo == hi and (lo_ex or hi_ex)):
        raise SchemaError("number bounds admit no value")
    step = schema.get("multipleOf")
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        return integer_generator(schema)
    low, high, low_ex, high_ex = float(lo), float(hi), lo_ex, hi_ex

    def gen_number(rng: random.Random, depth: int) -> Any:
        if low == high:
            return low
        value = low + (high - low) * (0.01 + 0.98 * rng.random())
        rounded = round(value, 3)
        ok_low = rounded > low if low_ex else rounded >= low
        ok_high = rounded < high if high_ex else rounded <= high
        return rounded if ok_low and ok_high else value

    return gen_number
