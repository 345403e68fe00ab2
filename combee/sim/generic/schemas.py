"""JSON Schema compilation: a schema analysed once into a generator of valid instances.

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
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from combee.sim.generic.answer import SOFT_DEPTH, SchemaError
from combee.sim.generic.prose import WORDS
from combee.sim.generic.scalars import Gen, int_or_none, integer_generator, number_generator, string_generator

__all__ = ["JSON_TYPES", "MAX_MERGES", "SchemaCompiler", "declared_types", "json_type"]


JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


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


MAX_MERGES = 32


def _any_value(rng: random.Random, depth: int) -> Any:
    """An instance of the unconstrained schema (``{}`` / ``true``): a short string."""
    return " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))


def json_type(value: Any) -> str:
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
    actual = json_type(value)
    allowed = set(types)
    return actual in allowed or (actual == "integer" and "number" in allowed)


class SchemaCompiler:
    """Turns one root schema into nested generator closures; ``$ref`` targets are compiled once each."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._refs: dict[str, Gen] = {}

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
        for _ in range(MAX_MERGES):
            if isinstance(schema, Mapping) and "$ref" in schema:
                schema = self.resolve(schema["$ref"])
            else:
                return schema
        raise SchemaError("$ref chain too long or cyclic")

    def _ref(self, ref: str) -> Gen:
        cached = self._refs.get(ref)
        if cached is not None:
            return cached
        cell: list[Gen] = []

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
        if merges > MAX_MERGES:
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

    def compile(self, schema: Any) -> Gen:
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
        types = declared_types(schema)
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
        gens: list[Gen] = []
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

    def _enum(self, values: Any, types: list[str] | None) -> Gen:
        if not isinstance(values, list) or not values:
            raise SchemaError("enum must be a non-empty list")
        allowed = [v for v in values if types is None or _type_matches(v, types)]
        if not allowed:
            raise SchemaError("no enum value matches the declared type")
        return lambda rng, depth: rng.choice(allowed)

    def _union(self, schema: Mapping[str, Any], key: str) -> Gen:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{key} must be a non-empty list")
        siblings = {k: v for k, v in schema.items() if k not in (key, "anyOf", "oneOf") and k not in _ANNOTATIONS}
        gens: list[Gen] = []
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
        types = declared_types(schema) or _inferred_types(schema)
        return types is not None and all(t in _SCALARS for t in types)

    def _typed(self, schema: Mapping[str, Any], name: str) -> Gen:
        if name == "object":
            return self._object(schema)
        if name == "array":
            return self._array(schema)
        if name == "string":
            return string_generator(schema)
        if name == "integer":
            return integer_generator(schema)
        if name == "number":
            return number_generator(schema)
        if name == "boolean":
            return lambda rng, depth: rng.random() < 0.5
        return lambda rng, depth: None  # "null"

    def _object(self, schema: Mapping[str, Any]) -> Gen:
        props = schema.get("properties") or {}
        if not isinstance(props, Mapping):
            raise SchemaError("properties must be an object")
        required_list = schema.get("required") or []
        if not isinstance(required_list, list):
            raise SchemaError("required must be a list")
        required = set(required_list)
        extra = schema.get("additionalProperties", True)
        extra_gen: Gen | None = None
        if extra is not False:
            extra_gen = _any_value if extra is True else self.compile(extra)
        fields: list[tuple[str, Gen, bool]] = []
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
        min_props = int_or_none(schema, "minProperties") or 0
        max_props = int_or_none(schema, "maxProperties")
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
            skipped: list[tuple[str, Gen]] = []
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

    def _array(self, schema: Mapping[str, Any]) -> Gen:
        items = schema.get("items", True)
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft-4..2019 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix_gens = [self.compile(sub) for sub in (prefix or [])]
        item_gen: Gen | None = None
        if items is not False:
            item_gen = _any_value if items is True else self.compile(items)
        min_items = int_or_none(schema, "minItems") or 0
        max_items = int_or_none(schema, "maxItems")
        if item_gen is None:
            max_items = len(prefix_gens) if max_items is None else min(max_items, len(prefix_gens))
        if max_items is not None and min_items > max_items:
            raise SchemaError("minItems exceeds maxItems (or the items allowed)")
        unique = schema.get("uniqueItems") is True
        n_prefix = len(prefix_gens)

        def item_at(i: int) -> Gen:
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


def _make_unique(out: list[Any], item_at: Callable[[int], Gen], rng: random.Random, depth: int) -> list[Any]:
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


def _choice(gens: list[Gen], terminal: list[int]) -> Gen:
    if len(gens) == 1:
        return gens[0]
    first_terminal = gens[terminal[0]] if terminal else None

    def gen_choice(rng: random.Random, depth: int) -> Any:
        if depth >= SOFT_DEPTH and first_terminal is not None:
            return first_terminal(rng, depth)
        return rng.choice(gens)(rng, depth)

    return gen_choice


def declared_types(schema: Mapping[str, Any]) -> list[str] | None:
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
        unknown = [t for t in types if t not in JSON_TYPES]
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
