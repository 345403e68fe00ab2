"""Generic answers for requests the world model does not recognise — schema-valid, seeded, cheap.

What a generic answer is (:func:`generic_answer`), in order of precedence:

* ``tools`` present and ``tool_choice`` not ``"none"``: one tool call (``finish_reason="tool_calls"``) whose
  ``arguments`` are a JSON instance valid for the chosen function's ``parameters`` schema. A named
  ``tool_choice`` picks that function; ``"required"`` picks one by rng; ``"auto"`` (or absent) calls a tool
  chosen by rng with probability :data:`AUTO_TOOL_CALL_P`, else answers as below.
* ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": S}}`` or llama.cpp's
  ``{"type": "json_object", "schema": S}``: a JSON instance valid for ``S``.
* plain ``{"type": "json_object"}``: a small JSON object ``{"answer": <prose>, "confidence": <0..1>}``.
* otherwise: prose of an rng-drawn length (lognormal around 60 words, 8 to 400).

Everything is a pure function of the request and the rng, so the same request gets the same answer.

Supported JSON Schema keywords for generation: ``type`` (incl. type lists and OpenAPI ``nullable``),
``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``, ``minProperties`` /
``maxProperties``, ``items`` (and the old tuple form), ``prefixItems``, ``minItems`` / ``maxItems``,
``uniqueItems`` (best effort), ``minLength`` / ``maxLength``, ``format`` (date-time, date, time, email, uri,
uuid), ``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum`` (both drafts),
``multipleOf`` for integers, ``anyOf`` / ``oneOf`` (one branch picked by rng; for ``oneOf`` the branches are
assumed disjoint, as in pydantic's discriminated unions), ``allOf`` (shallow merge — exact for pydantic's
single-``$ref`` wrapper), local ``$ref`` (``#``, ``#/$defs/…``, ``#/definitions/…``, any local JSON
pointer; recursion allowed), boolean schemas. Ignored: ``pattern``, ``patternProperties``,
``propertyNames``, ``contains``, ``not``, ``if``/``then``/``else``, ``dependent*`` — a schema relying on
those may get an instance that violates them. A recursive reference reached through a multi-member ``allOf``
(whose members are merged, i.e. inlined) is rejected with :class:`SchemaError`.

Optional properties are included with probability 1/2 and arrays get up to ``minItems + 3`` items, but past
nesting depth :data:`SOFT_DEPTH` generation goes minimal (required properties only, ``minItems`` items,
scalar branches of unions preferred) so recursive schemas terminate. A schema that admits no value (or only
infinitely deep ones) raises :class:`SchemaError`, which the server answers with HTTP 400, as real servers
reject schemas they cannot honour.

Compiled generators are cached by the schema's canonical JSON (:func:`compiled_schema`), so a schema sent
with every request is analysed once.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from combee.errors import CombeeError
from combee.sim.protocol import SimRequest
from combee.tokens import estimate_tokens

__all__ = [
    "AUTO_TOOL_CALL_P",
    "SOFT_DEPTH",
    "Answer",
    "CompiledSchema",
    "InvalidRequest",
    "SchemaError",
    "ToolCall",
    "compile_schema",
    "compiled_schema",
    "conforms",
    "forced_tool",
    "generic_answer",
    "prose",
    "requested_schema",
    "truncate_answer",
    "wants_json",
    "within_contract",
]

AUTO_TOOL_CALL_P = 0.8
"""With ``tool_choice`` ``"auto"`` (or absent), the probability that the generic answer is a tool call."""

SOFT_DEPTH = 4
"""Nesting depth past which generated instances go minimal, so recursive schemas terminate."""

_CHARS_PER_TOKEN = 4  # matches combee.tokens: truncating to max_tokens·4 characters gives ≤ max_tokens


class InvalidRequest(CombeeError, ValueError):
    """The request cannot be answered as sent; the server answers HTTP 400. ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class SchemaError(InvalidRequest):
    """A JSON schema is malformed, unsupported (external ``$ref``) or admits no (finite) value."""


@dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant message; ``arguments`` is JSON text (possibly truncated/broken)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    """The assistant message the server will send, before transport concerns.

    ``schema`` is what ``content`` (or, for tool calls, the first call's ``arguments``) is meant to satisfy,
    if known; ``is_json`` says the content is meant to be JSON at all. Both guide the malformed-content fault.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    schema: Mapping[str, Any] | None = None
    is_json: bool = False
    source: str = "generic"

    @property
    def completion_text(self) -> str:
        """The text whose tokens are the completion: the content, or the tool calls' arguments."""
        if self.tool_calls:
            return "".join(call.arguments for call in self.tool_calls)
        return self.content or ""


# --------------------------------------------------------------------------------------------------------
# Prose

_VOCABULARY = """
    the a an of to in for on with by from as at into over under after before between across within without
    result value table column row report ledger entry account balance total amount rate share price cost
    revenue margin ratio period quarter year month growth change increase decrease check verify compare
    compute derive apply update keep drop merge note rule step plan answer question context detail insight
    example case pattern error issue reason source field record list item group level order number figure
    first second next last each every other same different specific general exact careful simple clear
    data model agent prompt tool call output input format schema section summary evidence signal trace
    is are was were be has have had can should must may will does do not only also then when if because
    so but and or while where which that this these those it its their our we they one two three several
"""
_WORDS: tuple[str, ...] = tuple(_VOCABULARY.split())


def prose(rng: random.Random, words: int | None = None) -> str:
    """Deterministic filler sentences (6–16 words each); ``words`` defaults to an rng-drawn length."""
    n = words if words is not None else max(8, min(400, int(rng.lognormvariate(math.log(60.0), 0.6))))
    sentences: list[str] = []
    remaining = n
    while remaining > 0:
        k = min(remaining, rng.randint(6, 16))
        chosen = rng.choices(_WORDS, k=k)
        chosen[0] = chosen[0].capitalize()
        sentences.append(" ".join(chosen) + ".")
        remaining -= k
    return " ".join(sentences)


# --------------------------------------------------------------------------------------------------------
# Schema compilation

_Gen = Callable[[random.Random, int], Any]
"""A compiled generator: ``(rng, depth) -> JSON value``."""

_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$schema",
        "$id",
        "$defs",
        "definitions",
        "discriminator",
        "strict",
    }
)
_OBJECT_KEYS = ("properties", "required", "additionalProperties", "minProperties", "maxProperties")
_ARRAY_KEYS = ("items", "prefixItems", "minItems", "maxItems", "uniqueItems")
_STRING_KEYS = ("minLength", "maxLength", "format", "pattern")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_MAX_MERGES = 32


def _any_value(rng: random.Random, depth: int) -> Any:
    """An instance of the unconstrained schema (``{}`` / ``true``): a short string."""
    return " ".join(rng.choices(_WORDS, k=rng.randint(1, 4)))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "unknown"


def _type_matches(value: Any, types: Iterable[str]) -> bool:
    actual = _json_type(value)
    allowed = set(types)
    return actual in allowed or (actual == "integer" and "number" in allowed)


def _int_or_none(schema: Mapping[str, Any], key: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SchemaError(f"{key} must be a non-negative integer, got {value!r}")
    return int(value)


class _Compiler:
    """Turns one root schema into nested generator closures; ``$ref`` targets are compiled once each."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._refs: dict[str, _Gen] = {}

    # -- references and merging --------------------------------------------------------------------------

    def resolve(self, ref: Any) -> Any:
        """The schema a local ``$ref`` points at."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local $ref ('#/...') is supported, got {ref!r}")
        node = self._root
        pointer = ref[1:]
        if pointer:
            if not pointer.startswith("/"):
                raise SchemaError(f"unsupported $ref {ref!r}")
            for raw in pointer[1:].split("/"):
                token = raw.replace("~1", "/").replace("~0", "~")
                if isinstance(node, Mapping) and token in node:
                    node = node[token]
                elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                    node = node[int(token)]
                else:
                    raise SchemaError(f"$ref {ref!r} does not resolve")
        return node

    def deref(self, schema: Any) -> Any:
        """Follow top-level ``$ref`` chains (for merging/analysis; generation compiles refs lazily)."""
        for _ in range(_MAX_MERGES):
            if isinstance(schema, Mapping) and "$ref" in schema:
                schema = self.resolve(schema["$ref"])
            else:
                return schema
        raise SchemaError("$ref chain too long or cyclic")

    def _ref(self, ref: str) -> _Gen:
        cached = self._refs.get(ref)
        if cached is not None:
            return cached
        cell: list[_Gen] = []

        def through_ref(rng: random.Random, depth: int) -> Any:
            return cell[0](rng, depth)

        self._refs[ref] = through_ref  # registered before compiling the target, so recursion closes
        try:
            cell.append(self.compile(self.resolve(ref)))
        except SchemaError:
            del self._refs[ref]
            raise
        return through_ref

    def merge_all_of(self, schema: Mapping[str, Any], merges: int = 0) -> dict[str, Any]:
        """Shallow merge of ``allOf`` members into their parent (properties united, bounds tightened)."""
        if merges > _MAX_MERGES:
            raise SchemaError("allOf nesting too deep or cyclic")
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        members = schema["allOf"]
        if not isinstance(members, list):
            raise SchemaError("allOf must be a list")
        for member in members:
            sub = self.deref(member)
            if sub is True:
                continue
            if sub is False:
                raise SchemaError("allOf contains `false`")
            if not isinstance(sub, Mapping):
                raise SchemaError("allOf members must be schemas")
            if "allOf" in sub:
                sub = self.merge_all_of(sub, merges + 1)
            merged = _merge(merged, sub)
        return merged

    # -- compilation -------------------------------------------------------------------------------------

    def compile(self, schema: Any) -> _Gen:
        """A generator for ``schema``; raises :class:`SchemaError` if it admits no value."""
        if schema is True:
            return _any_value
        if schema is False:
            raise SchemaError("schema `false` admits no value")
        if not isinstance(schema, Mapping):
            raise SchemaError(f"a schema must be an object or a boolean, got {type(schema).__name__}")
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "allOf" in schema:
            members = schema["allOf"]
            if isinstance(members, list) and len(members) == 1 and set(schema) - _ANNOTATIONS == {"allOf"}:
                return self.compile(members[0])  # pydantic's wrapper: keeps a $ref lazy, so recursion closes
            return self.compile(self.merge_all_of(schema))
        types = _declared_types(schema)
        if "const" in schema:
            const = schema["const"]
            return lambda rng, depth: const
        if "enum" in schema:
            return self._enum(schema["enum"], types)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._union(schema, key)
        if types is None:
            types = _inferred_types(schema)
        if types is None:
            return _any_value
        gens: list[_Gen] = []
        terminal: list[int] = []
        for name in types:
            try:
                gen = self._typed(schema, name)
            except SchemaError:
                if len(types) == 1:
                    raise
                continue
            if name in _SCALARS:
                terminal.append(len(gens))
            gens.append(gen)
        if not gens:
            raise SchemaError(f"no type in {types} is satisfiable")
        return _choice(gens, terminal)

    def _enum(self, values: Any, types: list[str] | None) -> _Gen:
        if not isinstance(values, list) or not values:
            raise SchemaError("enum must be a non-empty list")
        allowed = [v for v in values if types is None or _type_matches(v, types)]
        if not allowed:
            raise SchemaError("no enum value matches the declared type")
        return lambda rng, depth: rng.choice(allowed)

    def _union(self, schema: Mapping[str, Any], key: str) -> _Gen:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{key} must be a non-empty list")
        siblings = {k: v for k, v in schema.items() if k not in (key, "anyOf", "oneOf") and k not in _ANNOTATIONS}
        gens: list[_Gen] = []
        terminal: list[int] = []
        for branch in branches:
            try:
                if siblings:
                    sub = self.deref(branch)
                    if sub is False:
                        continue
                    branch = _merge(siblings, {} if sub is True else sub)
                gen = self.compile(branch)
            except SchemaError:
                continue
            if self._is_terminal(branch):
                terminal.append(len(gens))
            gens.append(gen)
        if not gens:
            raise SchemaError(f"no branch of {key} is satisfiable")
        return _choice(gens, terminal)

    def _is_terminal(self, schema: Any) -> bool:
        """True when ``schema`` can only produce scalars (so choosing it at depth ends recursion)."""
        try:
            schema = self.deref(schema)
        except SchemaError:
            return False
        if not isinstance(schema, Mapping):
            return False
        if "const" in schema or "enum" in schema:
            return True
        types = _declared_types(schema) or _inferred_types(schema)
        return types is not None and all(t in _SCALARS for t in types)

    def _typed(self, schema: Mapping[str, Any], name: str) -> _Gen:
        if name == "object":
            return self._object(schema)
        if name == "array":
            return self._array(schema)
        if name == "string":
            return _string(schema)
        if name == "integer":
            return _integer(schema)
        if name == "number":
            return _number(schema)
        if name == "boolean":
            return lambda rng, depth: rng.random() < 0.5
        return lambda rng, depth: None  # "null"

    def _object(self, schema: Mapping[str, Any]) -> _Gen:
        props = schema.get("properties") or {}
        if not isinstance(props, Mapping):
            raise SchemaError("properties must be an object")
        required_list = schema.get("required") or []
        if not isinstance(required_list, list):
            raise SchemaError("required must be a list")
        required = set(required_list)
        extra = schema.get("additionalProperties", True)
        extra_gen: _Gen | None = None
        if extra is not False:
            extra_gen = _any_value if extra is True else self.compile(extra)
        fields: list[tuple[str, _Gen, bool]] = []
        for name, sub in props.items():
            if sub is False:
                if name in required:
                    raise SchemaError(f"required property {name!r} has schema `false`")
                continue
            try:
                fields.append((name, self.compile(sub), name in required))
            except SchemaError:
                if name in required:
                    raise
        for name in required_list:
            if name not in props:
                if extra_gen is None:
                    raise SchemaError(f"required property {name!r} is forbidden by additionalProperties")
                fields.append((name, extra_gen, True))
        min_props = _int_or_none(schema, "minProperties") or 0
        max_props = _int_or_none(schema, "maxProperties")
        n_required = sum(1 for _, _, req in fields if req)
        if max_props is not None and (n_required > max_props or min_props > max_props):
            raise SchemaError("maxProperties is below what required/minProperties demand")
        # A map-like schema (no named properties, a value schema) gets a few keys of its own.
        map_like = not props and isinstance(extra, Mapping) and "patternProperties" not in schema
        if min_props > len(fields) and extra_gen is None:
            raise SchemaError("minProperties exceeds the properties additionalProperties allows")
        cap = max_props if max_props is not None else 1 << 30

        def gen_object(rng: random.Random, depth: int) -> Any:
            deep = depth >= SOFT_DEPTH
            out: dict[str, Any] = {}
            skipped: list[tuple[str, _Gen]] = []
            for name, gen, req in fields:
                if req or (not deep and len(out) < cap and rng.random() < 0.5):
                    out[name] = gen(rng, depth + 1)
                else:
                    skipped.append((name, gen))
            wanted = len(out) if deep or not map_like else len(out) + rng.randint(1, 3)
            wanted = min(max(wanted, min_props), cap)
            for name, gen in skipped:
                if len(out) >= wanted:
                    break
                out[name] = gen(rng, depth + 1)
            index = 0
            while len(out) < wanted and extra_gen is not None:
                index += 1
                key = f"key_{index}"
                if key not in out and key not in props:
                    out[key] = extra_gen(rng, depth + 1)
            return out

        return gen_object

    def _array(self, schema: Mapping[str, Any]) -> _Gen:
        items = schema.get("items", True)
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft-4..2019 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix_gens = [self.compile(sub) for sub in (prefix or [])]
        item_gen: _Gen | None = None
        if items is not False:
            item_gen = _any_value if items is True else self.compile(items)
        min_items = _int_or_none(schema, "minItems") or 0
        max_items = _int_or_none(schema, "maxItems")
        if item_gen is None:
            max_items = len(prefix_gens) if max_items is None else min(max_items, len(prefix_gens))
        if max_items is not None and min_items > max_items:
            raise SchemaError("minItems exceeds maxItems (or the items allowed)")
        unique = schema.get("uniqueItems") is True
        n_prefix = len(prefix_gens)

        def item_at(i: int) -> _Gen:
            if i < n_prefix:
                return prefix_gens[i]
            assert item_gen is not None  # guaranteed by the max_items cap above
            return item_gen

        def gen_array(rng: random.Random, depth: int) -> Any:
            if depth >= SOFT_DEPTH:
                n = min_items
            else:
                hi = min_items + 3 if max_items is None else min(max_items, min_items + 3)
                n = rng.randint(min(max(min_items, 1), hi), hi)
            out = [item_at(i)(rng, depth + 1) for i in range(n)]
            if unique:
                out = _make_unique(out, item_at, rng, depth + 1)
            return out

        return gen_array


def _make_unique(out: list[Any], item_at: Callable[[int], _Gen], rng: random.Random, depth: int) -> list[Any]:
    """Best-effort ``uniqueItems``: redraw a duplicate up to 8 times, then drop it (which may, for tiny value
    spaces, leave fewer than ``minItems`` items)."""
    seen: set[str] = set()
    result: list[Any] = []
    for i, value in enumerate(out):
        key = json.dumps(value, sort_keys=True)
        tries = 0
        while key in seen and tries < 8:
            value = item_at(i)(rng, depth)
            key = json.dumps(value, sort_keys=True)
            tries += 1
        if key not in seen:
            seen.add(key)
            result.append(value)
    return result


def _choice(gens: list[_Gen], terminal: list[int]) -> _Gen:
    if len(gens) == 1:
        return gens[0]
    first_terminal = gens[terminal[0]] if terminal else None

    def gen_choice(rng: random.Random, depth: int) -> Any:
        if depth >= SOFT_DEPTH and first_terminal is not None:
            return first_terminal(rng, depth)
        return rng.choice(gens)(rng, depth)

    return gen_choice


def _declared_types(schema: Mapping[str, Any]) -> list[str] | None:
    declared = schema.get("type")
    if declared is None:
        types = None
    elif isinstance(declared, str):
        types = [declared]
    elif isinstance(declared, list) and declared and all(isinstance(t, str) for t in declared):
        types = list(dict.fromkeys(declared))
    else:
        raise SchemaError(f"type must be a name or a non-empty list of names, got {declared!r}")
    if types is not None:
        unknown = [t for t in types if t not in _JSON_TYPES]
        if unknown:
            raise SchemaError(f"unknown type {unknown[0]!r}")
    if schema.get("nullable") is True:
        base = types if types is not None else _inferred_types(schema)
        if base is not None and "null" not in base:
            types = [*base, "null"]
    return types


def _inferred_types(schema: Mapping[str, Any]) -> list[str] | None:
    """The type a keyword-only schema is meant for (e.g. ``{"properties": ...}`` → object), else None."""
    for keys, name in (
        (_OBJECT_KEYS, "object"),
        (_ARRAY_KEYS, "array"),
        (_STRING_KEYS, "string"),
        (_NUMBER_KEYS, "number"),
    ):
        if any(k in schema for k in keys):
            return [name]
    return None


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Shallow conjunction of two schemas (right for the shapes allOf and union siblings take in practice)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key == "properties" and isinstance(value, Mapping) and isinstance(out[key], Mapping):
            props = dict(out[key])
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[key] = props
        elif key == "required" and isinstance(value, list) and isinstance(out[key], list):
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "type":
            left = out[key] if isinstance(out[key], list) else [out[key]]
            right = value if isinstance(value, list) else [value]
            both = [t for t in left if t in right or (t == "integer" and "number" in right)]
            both += [t for t in right if t == "integer" and "number" in left and t not in both]
            if not both:
                raise SchemaError(f"allOf types {left} and {right} do not intersect")
            out[key] = both
        elif key in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
            if isinstance(value, int | float) and isinstance(out[key], int | float):
                out[key] = max(out[key], value)
        elif key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
            if isinstance(value, int | float) and isinstance(out[key], int | float):
                out[key] = min(out[key], value)
        elif key == "additionalProperties" and value is False:
            out[key] = False
        elif key == "enum" and isinstance(value, list) and isinstance(out[key], list):
            out[key] = [v for v in out[key] if v in value]
    return out


def _string(schema: Mapping[str, Any]) -> _Gen:
    min_len = _int_or_none(schema, "minLength") or 0
    max_len = _int_or_none(schema, "maxLength")
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
        text = " ".join(rng.choices(_WORDS, k=length // 5 + 1))  # words average ~6 characters with a space
        while len(text) < length:
            text += " " + " ".join(rng.choices(_WORDS, k=length // 10 + 1))
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
    "email": lambda rng: f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.choice(_WORDS)}/{rng.randint(1, 999)}",
    "url": lambda rng: f"https://example.com/{rng.choice(_WORDS)}/{rng.randint(1, 999)}",
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


def _integer(schema: Mapping[str, Any]) -> _Gen:
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


def _number(schema: Mapping[str, Any]) -> _Gen:
    lo_b, lo_ex, hi_b, hi_ex = _bounds(schema)
    lo = lo_b if lo_b is not None else (0.0 if hi_b is None else hi_b - 100.0)
    hi = hi_b if hi_b is not None else lo + 100.0
    if lo > hi or (lo == hi and (lo_ex or hi_ex)):
        raise SchemaError("number bounds admit no value")
    step = schema.get("multipleOf")
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        return _integer(schema)
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


# --------------------------------------------------------------------------------------------------------
# Compiled schemas and violations


class CompiledSchema:
    """A schema analysed once: :meth:`generate` draws valid instances, :meth:`violation` an invalid one."""

    __slots__ = ("_gen", "_top_types", "schema")

    def __init__(self, schema: Any) -> None:
        compiler = _Compiler(schema)
        self.schema = schema
        try:
            self._gen = compiler.compile(schema)
        except RecursionError:  # e.g. a cycle through allOf merges, which inline their members
            raise SchemaError("schema nesting too deep (or a reference cycle through allOf)") from None
        self._top_types = _allowed_types(schema, compiler, 0)

    def generate(self, rng: random.Random) -> Any:
        """One valid instance (deterministic for a given rng state). Raises :class:`SchemaError` when the
        schema only admits infinitely nested values."""
        try:
            return self._gen(rng, 0)
        except RecursionError:
            raise SchemaError("schema admits only unboundedly nested values") from None

    def violation(self, rng: random.Random) -> str | None:
        """JSON text of a value whose top-level type the schema forbids, or None when the schema allows every
        non-numeric type at the top (then no violation can be built this way)."""
        if self._top_types is None:
            return None
        candidates = [text for name, text in _VIOLATORS if name not in self._top_types]
        return rng.choice(candidates) if candidates else None


_VIOLATORS: tuple[tuple[str, str], ...] = (
    ("array", '["combee-sim: not what the schema asked for"]'),
    ("string", '"combee-sim: not what the schema asked for"'),
    ("object", '{"combee_sim": "not what the schema asked for"}'),
    ("boolean", "false"),
    ("null", "null"),
)


def _allowed_types(schema: Any, compiler: _Compiler, depth: int) -> frozenset[str] | None:
    """The top-level JSON types ``schema`` admits (None = unconstrained). Numbers are never used to violate,
    so ``integer`` vs ``number`` precision does not matter here."""
    if depth > _MAX_MERGES:
        return None
    if schema is True:
        return None
    if schema is False:
        return frozenset()
    if not isinstance(schema, Mapping):
        return None
    if "$ref" in schema:
        return _allowed_types(compiler.resolve(schema["$ref"]), compiler, depth + 1)
    own: frozenset[str] | None = None
    declared = _declared_types(schema)
    if declared is not None:
        own = frozenset(declared)
    if "const" in schema:
        own = _meet(own, frozenset({_json_type(schema["const"])}))
    if isinstance(schema.get("enum"), list):
        own = _meet(own, frozenset(_json_type(v) for v in schema["enum"]))
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            union: set[str] = set()
            for branch in branches:
                got = _allowed_types(branch, compiler, depth + 1)
                if got is None:
                    union = set(_JSON_TYPES)
                    break
                union |= got
            own = _meet(own, frozenset(union))
    members = schema.get("allOf")
    if isinstance(members, list):
        for member in members:
            own = _meet(own, _allowed_types(member, compiler, depth + 1))
    return own


def _meet(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    if a is None:
        return b
    if b is None:
        return a
    widened_a = a | {"integer"} if "number" in a else a
    widened_b = b | {"integer"} if "number" in b else b
    return widened_a & widened_b


def compile_schema(schema: Any) -> CompiledSchema:
    """Analyse ``schema`` now (uncached). Raises :class:`SchemaError` if it is malformed or unsatisfiable."""
    return CompiledSchema(schema)


@functools.lru_cache(maxsize=1024)
def _compiled_by_key(key: str) -> CompiledSchema:
    return CompiledSchema(json.loads(key))


def compiled_schema(schema: Any) -> CompiledSchema:
    """:func:`compile_schema`, cached by the schema's canonical JSON (1,024 most recent schemas)."""
    return _compiled_by_key(json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


# --------------------------------------------------------------------------------------------------------
# Requests → answers


def requested_schema(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (OpenAI ``json_schema`` or llama.cpp ``json_object``
    + ``schema`` form), or None. Raises :class:`InvalidRequest` for a malformed ``response_format``."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidRequest("response_format.json_schema must be an object", "response_format")
        schema = spec.get("schema")
    elif kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "text":
        return None
    else:
        raise InvalidRequest(f"unsupported response_format type {kind!r}", "response_format")
    if schema is None:
        return None
    if not isinstance(schema, Mapping):
        raise InvalidRequest("the response_format schema must be an object", "response_format")
    return schema


def wants_json(response_format: Mapping[str, Any] | None) -> bool:
    """True when the request asks for JSON content (any ``json_object`` / ``json_schema`` format)."""
    return response_format is not None and response_format.get("type") in ("json_object", "json_schema")


def _tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidRequest("each tool must be {'type': 'function', 'function': {'name': ...}}", "tools")
        found.append((function["name"], function.get("parameters", {"type": "object", "properties": {}})))
    return found


def _chosen_tool(functions: list[tuple[str, Any]], tool_choice: Any, rng: random.Random) -> tuple[str, Any] | None:
    if tool_choice is None or tool_choice == "auto":
        return rng.choice(functions) if rng.random() < AUTO_TOOL_CALL_P else None
    if tool_choice in ("required", "any"):
        return rng.choice(functions)
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        for candidate in functions:
            if candidate[0] == name:
                return candidate
        raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    raise InvalidRequest(f"unsupported tool_choice {tool_choice!r}", "tool_choice")


def generic_answer(request: SimRequest, rng: random.Random) -> Answer:
    """The answer for a request no world model recognised (see the module docstring for the rules).

    Raises :class:`InvalidRequest` (incl. :class:`SchemaError`) for requests a real server would reject.
    """
    schema = requested_schema(request.response_format)
    if request.tools and request.tool_choice != "none":
        chosen = _chosen_tool(_tool_functions(request.tools), request.tool_choice, rng)
        if chosen is not None:
            name, parameters = chosen
            arguments = json.dumps(compiled_schema(parameters).generate(rng), ensure_ascii=False)
            call = ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=name, arguments=arguments)
            return Answer(
                content=None,
                tool_calls=(call,),
                finish_reason="tool_calls",
                schema=parameters if isinstance(parameters, Mapping) else None,
                is_json=True,
            )
    if schema is not None:
        instance = compiled_schema(schema).generate(rng)
        return Answer(content=json.dumps(instance, ensure_ascii=False), schema=schema, is_json=True)
    if wants_json(request.response_format):
        small = {"answer": prose(rng, rng.randint(5, 20)), "confidence": round(rng.random(), 2)}
        return Answer(content=json.dumps(small, ensure_ascii=False), is_json=True)
    return Answer(content=prose(rng))


def truncate_answer(answer: Answer, max_tokens: int | None) -> Answer:
    """Cut the completion to ``max_tokens`` (by the :func:`combee.tokens.estimate_tokens` measure) and mark
    ``finish_reason="length"`` if it was longer; otherwise return ``answer`` unchanged.

    Truncated structured output is broken JSON on purpose: that is what a real server sends when a
    generation hits the token limit, and clients must treat it as malformed.
    """
    if max_tokens is None:
        return answer
    limit = max_tokens * _CHARS_PER_TOKEN
    if answer.tool_calls:
        if estimate_tokens(answer.completion_text) <= max_tokens:
            return answer
        calls: list[ToolCall] = []
        budget = limit
        for call in answer.tool_calls:
            calls.append(replace(call, arguments=call.arguments[: max(0, budget)]))
            budget -= len(call.arguments)
        return replace(answer, tool_calls=tuple(calls), finish_reason="length")
    content = answer.content or ""
    if estimate_tokens(content) <= max_tokens:
        return answer
    return replace(answer, content=content[:limit], finish_reason="length")


# --------------------------------------------------------------------------------------------------------
# The request's contract, before any world model


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "integer": (int,),
    "number": (int, float),
}


def conforms(value: Any, schema: Any, root: Any = None, depth: int = 0) -> bool:
    """Whether ``value`` satisfies ``schema`` on the keywords that decide an answer's *shape*.

    Checked: ``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``, ``items``,
    ``minItems`` / ``maxItems``, ``anyOf`` / ``oneOf`` (any branch), ``allOf`` (every member), local ``$ref``.
    Not checked (an answer is not refused for them): string and number bounds, ``pattern``, ``format``. Enough
    to tell a world model's answer written for one client's schema from what another client's schema asks.
    """
    root = schema if root is None else root
    if depth > 64:
        return False
    if schema is True or schema is None:
        return True
    if schema is False or not isinstance(schema, Mapping):
        return False
    if "$ref" in schema:
        try:
            target = _Compiler(root).resolve(schema["$ref"])
        except SchemaError:
            return False
        if not conforms(value, target, root, depth + 1):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    try:
        types = _declared_types(schema)
    except SchemaError:
        return False
    if types is not None and not any(_is_json_type(value, t) for t in types):
        return False
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and not any(conforms(value, b, root, depth + 1) for b in branches):
            return False
    members = schema.get("allOf")
    if isinstance(members, list) and not all(conforms(value, m, root, depth + 1) for m in members):
        return False
    if isinstance(value, dict):
        declared = schema.get("properties")
        properties: Mapping[str, Any] = declared if isinstance(declared, Mapping) else {}
        wanted = schema.get("required")
        required: list[Any] = wanted if isinstance(wanted, list) else []
        if any(name not in value for name in required):
            return False
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                if not conforms(item, properties[name], root, depth + 1):
                    return False
            elif not conforms(item, extra, root, depth + 1):
                return False
    if isinstance(value, list):
        low, high = _int_or_none(schema, "minItems"), _int_or_none(schema, "maxItems")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            return False
        items = schema.get("items")
        if isinstance(items, Mapping | bool) and not all(conforms(v, items, root, depth + 1) for v in value):
            return False
    return True


def _is_json_type(value: Any, name: str) -> bool:
    kinds = _PY_TYPES.get(name)
    if kinds is None:
        return True
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, kinds)


def forced_tool(request: SimRequest) -> tuple[str, Any] | None:
    """The function a request *requires* a call to, or None when it requires none.

    ``tool_choice`` ``"required"`` / ``"any"`` with exactly one tool, or a named function: that one. With several
    tools and ``"required"`` the first tool stands for the set (an answer that fits it is a valid call); the
    generic answer picks among them by rng. Raises :class:`InvalidRequest` as :func:`generic_answer` does.
    """
    if not request.tools or request.tool_choice in (None, "auto", "none"):
        return None
    functions = _tool_functions(request.tools)
    choice = request.tool_choice
    if choice in ("required", "any"):
        return functions[0]
    return _chosen_tool(functions, choice, random.Random(0))


def within_contract(request: SimRequest, text: str, rng: random.Random) -> Answer | None:
    """A world model's ``text`` as the answer ``request`` demands, or None when it cannot be that answer.

    The contract comes first: a forced tool call (``tool_choice`` ``"required"`` / named) gets a tool call whose
    arguments are ``text``, if ``text`` is JSON that fits the function's parameters; ``response_format``
    ``json_schema`` (or ``json_object`` + ``schema``) gets ``text`` if it is JSON that fits the schema; plain
    ``json_object`` if it is a JSON object. None means the caller answers generically (schema-valid), as a
    real model constrained by the request would rather than break the contract.
    """
    forced = forced_tool(request)
    schema = requested_schema(request.response_format)
    if forced is None and not wants_json(request.response_format):
        return Answer(content=text, source="responder")
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if forced is not None:
        name, parameters = forced
        if not isinstance(value, dict) or not conforms(value, parameters):
            return None
        call = ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=name, arguments=text)
        return Answer(
            content=None,
            tool_calls=(call,),
            finish_reason="tool_calls",
            schema=parameters if isinstance(parameters, Mapping) else None,
            is_json=True,
            source="responder",
        )
    if schema is not None and not conforms(value, schema):
        return None
    if schema is None and not isinstance(value, dict):
        return None
    return Answer(content=text, schema=schema, is_json=True, source="responder")
