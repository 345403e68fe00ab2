"""Compiled schemas, cached by canonical JSON (:func:`compiled_schema`), and the invalid instances they draw."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Mapping
from typing import Any

from combee.sim.generic.answer import SchemaError
from combee.sim.generic.schemas import JSON_TYPES, MAX_MERGES, SchemaCompiler, declared_types, json_type

__all__ = ["CompiledSchema", "compile_schema", "compiled_schema"]


class CompiledSchema:
    """A schema analysed once: :meth:`generate` draws valid instances, :meth:`violation` an invalid one."""

    __slots__ = ("_gen", "_top_types", "schema")

    def __init__(self, schema: Any) -> None:
        compiler = SchemaCompiler(schema)
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


def _allowed_types(schema: Any, compiler: SchemaCompiler, depth: int) -> frozenset[str] | None:
    """The top-level JSON types ``schema`` admits (None = unconstrained). Numbers are never used to violate,
    so ``integer`` vs ``number`` precision does not matter here."""
    if depth > MAX_MERGES:
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
    declared = declared_types(schema)
    if declared is not None:
        own = frozenset(declared)
    if "const" in schema:
        own = _meet(own, frozenset({json_type(schema["const"])}))
    if isinstance(schema.get("enum"), list):
        own = _meet(own, frozenset(json_type(v) for v in schema["enum"]))
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            union: set[str] = set()
            for branch in branches:
                got = _allowed_types(branch, compiler, depth + 1)
                if got is None:
                    union = set(JSON_TYPES)
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
