"""JSON Schema → a generator of instances of the schema's *shape*, compiled once and cached by content.

Why the simulator generates from schemas at all, and why not only from Combee's: Combee's four schemas
(``combee.prompts.schemas``: reflector, curator, merger, generator) use ``type`` object/array/string,
``properties``, ``required``, ``additionalProperties: false``, ``enum``, ``anyOf``, ``items``, ``minItems`` /
``maxItems``, ``maxLength`` and ``pattern``. The simulator must also honour the contract of requests shaped like
another client's (issue 12, item 7: another prompt learner's tool parameters, typically written by pydantic), so
it keeps the shape keywords such schemas are built from: the other scalar types, ``const``, ``oneOf``, local
``$ref`` into ``$defs`` (recursion allowed) and pydantic's single-member ``allOf`` wrapper. That is what
:func:`combee.sim.generic.contract.conforms` checks an answer against, and no more.

Not generated (an instance may violate them, as :func:`conforms` does not check them): ``pattern``, ``format``,
``multipleOf``, ``uniqueItems``, ``prefixItems``, ``minProperties`` / ``maxProperties``, ``patternProperties``,
``not``, ``if``/``then``/``else``; extra properties beyond ``properties`` are never added. Refused with
:class:`SchemaError` (HTTP 400, as a real server refuses a schema it cannot honour): an ``allOf`` of several
members, an external ``$ref``, a schema that admits no value.

Optional properties are included with probability 1/2 and arrays get up to ``minItems + 3`` items; past nesting
depth :data:`SOFT_DEPTH` generation goes minimal (required properties only, ``minItems`` items, scalar branches
of unions preferred) so recursive schemas terminate.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from combee.sim.generic.answer import SOFT_DEPTH, SchemaError
from combee.sim.generic.prose import WORDS

__all__ = ["CompiledSchema", "SchemaCompiler", "compile_schema", "compiled_schema", "declared_types", "int_or_none"]

Gen = Callable[[random.Random, int], Any]
"""A compiled generator: ``(rng, depth) -> JSON value``."""

JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$defs", "definitions"})
#: JSON text of a value of each type, for :meth:`CompiledSchema.violation`.
_VIOLATORS: tuple[tuple[str, str], ...] = (
    ("array", '["combee-sim: not what the schema asked for"]'),
    ("string", '"combee-sim: not what the schema asked for"'),
    ("object", '{"combee_sim": "not what the schema asked for"}'),
    ("boolean", "false"),
    ("null", "null"),
)


def _any_value(rng: random.Random, depth: int) -> Any:
    """An instance of the unconstrained schema (``{}`` / ``true``): a short string."""
    return " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))


def int_or_none(schema: Mapping[str, Any], key: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SchemaError(f"{key} must be a non-negative integer, got {value!r}")
    return int(value)


def declared_types(schema: Mapping[str, Any]) -> list[str] | None:
    """The ``type`` of ``schema`` as a list (None when it declares none). Raises SchemaError when malformed."""
    declared = schema.get("type")
    if declared is None:
        return None
    types = [declared] if isinstance(declared, str) else declared
    if not isinstance(types, list) or not types or not all(isinstance(t, str) for t in types):
        raise SchemaError(f"type must be a name or a non-empty list of names, got {declared!r}")
    unknown = [t for t in types if t not in JSON_TYPES]
    if unknown:
        raise SchemaError(f"unknown type {unknown[0]!r}")
    return list(dict.fromkeys(types))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "integer" if float(value).is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else "unknown"


class SchemaCompiler:
    """Turns one root schema into nested generator closures; ``$ref`` targets are compiled once each."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._refs: dict[str, Gen] = {}

    def resolve(self, ref: Any) -> Any:
        """The schema a local ``$ref`` (a JSON pointer from ``#``) points at."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise SchemaError(f"only local $ref ('#/...') is supported, got {ref!r}")
        node = self._root
        for raw in ref[2:].split("/") if ref != "#" else ():
            token = raw.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or token not in node:
                raise SchemaError(f"$ref {ref!r} does not resolve")
            node = node[token]
        return node

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

    def compile(self, schema: Any) -> Gen:
        """A generator for ``schema``; raises :class:`SchemaError` if it admits no value or is unsupported."""
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
            if not isinstance(members, list) or len(members) != 1 or set(schema) - _ANNOTATIONS != {"allOf"}:
                raise SchemaError("allOf is supported only as a wrapper of one schema (pydantic's)")
            return self.compile(members[0])
        types = declared_types(schema)
        if "const" in schema:
            const = schema["const"]
            return lambda rng, depth: const
        if "enum" in schema:
            return _enum(schema["enum"], types)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._union(schema[key], key)
        if types is None:
            return _any_value
        gens = [self._typed(schema, name) for name in types]
        terminal = [i for i, name in enumerate(types) if name in _SCALARS]
        return _choice(gens, terminal)

    def _union(self, branches: Any, key: str) -> Gen:
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{key} must be a non-empty list")
        gens: list[Gen] = []
        terminal: list[int] = []
        for branch in branches:
            try:
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
        if not isinstance(schema, Mapping) or "$ref" in schema:
            return False
        types = declared_types(schema)
        return "const" in schema or "enum" in schema or (types is not None and all(t in _SCALARS for t in types))

    def _typed(self, schema: Mapping[str, Any], name: str) -> Gen:
        if name == "object":
            return self._object(schema)
        if name == "array":
            return self._array(schema)
        if name == "string":
            return _string(schema)
        if name in ("integer", "number"):
            return _number(schema, integer=name == "integer")
        if name == "boolean":
            return lambda rng, depth: rng.random() < 0.5
        return lambda rng, depth: None  # "null"

    def _object(self, schema: Mapping[str, Any]) -> Gen:
        props = schema.get("properties") or {}
        required = schema.get("required") or []
        if not isinstance(props, Mapping) or not isinstance(required, list):
            raise SchemaError("properties must be an object and required a list")
        fields: list[tuple[str, Gen, bool]] = []
        for name, sub in props.items():
            try:
                fields.append((name, self.compile(sub), name in required))
            except SchemaError:
                if name in required:
                    raise
        for name in required:
            if name not in props:
                if schema.get("additionalProperties", True) is False:
                    raise SchemaError(f"required property {name!r} is forbidden by additionalProperties")
                fields.append((name, _any_value, True))

        def gen_object(rng: random.Random, depth: int) -> Any:
            deep = depth >= SOFT_DEPTH
            return {name: gen(rng, depth + 1) for name, gen, req in fields if req or (not deep and rng.random() < 0.5)}

        return gen_object

    def _array(self, schema: Mapping[str, Any]) -> Gen:
        items = schema.get("items", True)
        item_gen = _any_value if items is True else self.compile(items)
        min_items = int_or_none(schema, "minItems") or 0
        max_items = int_or_none(schema, "maxItems")
        if max_items is not None and min_items > max_items:
            raise SchemaError("minItems exceeds maxItems")

        def gen_array(rng: random.Random, depth: int) -> Any:
            if depth >= SOFT_DEPTH:
                n = min_items
            else:
                hi = min_items + 3 if max_items is None else min(max_items, min_items + 3)
                n = rng.randint(min(max(min_items, 1), hi), hi)
            return [item_gen(rng, depth + 1) for _ in range(n)]

        return gen_array


def _enum(values: Any, types: list[str] | None) -> Gen:
    if not isinstance(values, list) or not values:
        raise SchemaError("enum must be a non-empty list")
    allowed = [
        v
        for v in values
        if types is None or _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)
    ]
    if not allowed:
        raise SchemaError("no enum value matches the declared type")
    return lambda rng, depth: rng.choice(allowed)


def _string(schema: Mapping[str, Any]) -> Gen:
    """Whole words, between ``minLength`` and ``maxLength`` characters (64 at most when unbounded)."""
    min_len = int_or_none(schema, "minLength") or 0
    max_len = int_or_none(schema, "maxLength")
    if max_len is not None and min_len > max_len:
        raise SchemaError("minLength exceeds maxLength")
    hi = min(max_len if max_len is not None else max(min_len, 48), max(min_len, 48) + 16)
    lo = max(min_len, min(3, hi))

    def gen_string(rng: random.Random, depth: int) -> Any:
        length = rng.randint(lo, hi)
        text = ""
        while len(text) < length:
            text = (text + " " + rng.choice(WORDS)).lstrip()
        boundary = text.rfind(" ", 0, length + 1)  # end on a whole word when minLength allows
        return text[:boundary] if boundary >= max(min_len, 1) else text[:length]

    return gen_string


def _number(schema: Mapping[str, Any], *, integer: bool) -> Gen:
    """Within ``minimum``/``maximum`` and ``exclusiveMinimum``/``exclusiveMaximum`` (numbers, as draft 2020 and
    pydantic write them); 0 to 100 when unbounded."""
    bounds = [schema.get(k) for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")]
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, int | float)) for v in bounds):
        raise SchemaError("numeric bounds must be numbers")
    low_in, low_ex, high_in, high_ex = bounds
    if integer:
        lows = [None if low_in is None else math.ceil(low_in), None if low_ex is None else math.floor(low_ex) + 1]
        highs = [None if high_in is None else math.floor(high_in), None if high_ex is None else math.ceil(high_ex) - 1]
    else:
        lows, highs = [low_in, low_ex], [high_in, high_ex]
    lo = max((v for v in lows if v is not None), default=None)
    hi = min((v for v in highs if v is not None), default=None)
    lo = lo if lo is not None else (0 if hi is None else hi - 100)
    hi = hi if hi is not None else lo + 100
    strict = not integer and (low_ex is not None or high_ex is not None)
    if lo > hi or (strict and lo == hi):
        raise SchemaError("numeric bounds admit no value")
    if integer:
        return lambda rng, depth: rng.randint(int(lo), int(hi))

    def gen_number(rng: random.Random, depth: int) -> Any:
        value = lo + (hi - lo) * (0.01 + 0.98 * rng.random())  # inside the bounds, exclusive or not
        rounded = round(value, 3)
        return rounded if lo < rounded < hi or (lo == hi == rounded) else value

    return gen_number


def _choice(gens: list[Gen], terminal: list[int]) -> Gen:
    if len(gens) == 1:
        return gens[0]
    first_terminal = gens[terminal[0]] if terminal else None

    def gen_choice(rng: random.Random, depth: int) -> Any:
        if depth >= SOFT_DEPTH and first_terminal is not None:
            return first_terminal(rng, depth)
        return rng.choice(gens)(rng, depth)

    return gen_choice


def _top_types(schema: Any, compiler: SchemaCompiler, depth: int = 0) -> frozenset[str] | None:
    """The top-level JSON types ``schema`` admits (None: any)."""
    if depth > 32 or not isinstance(schema, Mapping):
        return None if schema is not False else frozenset()
    if "$ref" in schema:
        return _top_types(compiler.resolve(schema["$ref"]), compiler, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        return _top_types(schema["allOf"][0], compiler, depth + 1)
    if "const" in schema:
        return frozenset({_json_type(schema["const"])})
    if isinstance(schema.get("enum"), list):
        return frozenset(_json_type(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            union: set[str] = set()
            for branch in schema[key]:
                got = _top_types(branch, compiler, depth + 1)
                if got is None:
                    return None
                union |= got
            return frozenset(union)
    declared = declared_types(schema)
    return None if declared is None else frozenset(declared)


class CompiledSchema:
    """A schema analysed once: :meth:`generate` draws instances, :meth:`violation` an invalid one."""

    __slots__ = ("_gen", "_top", "schema")

    def __init__(self, schema: Any) -> None:
        compiler = SchemaCompiler(schema)
        self.schema = schema
        try:
            self._gen = compiler.compile(schema)
        except RecursionError:  # e.g. a $ref chain that never reaches a schema
            raise SchemaError("schema nesting too deep (or a reference cycle)") from None
        self._top = _top_types(schema, compiler)

    def generate(self, rng: random.Random) -> Any:
        """One instance (deterministic for a given rng state). Raises :class:`SchemaError` when the schema only
        admits infinitely nested values."""
        try:
            return self._gen(rng, 0)
        except RecursionError:
            raise SchemaError("schema admits only unboundedly nested values") from None

    def violation(self, rng: random.Random) -> str | None:
        """JSON text of a value whose top-level type the schema forbids, or None when it allows every
        non-numeric type at the top (then no violation can be built this way)."""
        if self._top is None:
            return None
        allowed = self._top | ({"integer"} if "number" in self._top else set())
        candidates = [text for name, text in _VIOLATORS if name not in allowed]
        return rng.choice(candidates) if candidates else None


def compile_schema(schema: Any) -> CompiledSchema:
    """Analyse ``schema`` now (uncached). Raises :class:`SchemaError` if it is malformed or unsatisfiable."""
    return CompiledSchema(schema)


@functools.lru_cache(maxsize=1024)
def _compiled_by_key(key: str) -> CompiledSchema:
    return CompiledSchema(json.loads(key))


def compiled_schema(schema: Any) -> CompiledSchema:
    """:func:`compile_schema`, cached by the schema's canonical JSON (1,024 most recent schemas)."""
    return _compiled_by_key(json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
