"""Generic answers for requests the world model does not recognise — schema-valid, seeded, cheap.

``answer`` (what an answer is), ``prose``, ``schemas`` (JSON Schema → a generator of valid instances), ``compiled``
(compiled schemas and their violations), ``respond`` (a request → its generic answer) and ``contract``
(whether an answer keeps to its request).
"""

from combee.sim.generic.answer import AUTO_TOOL_CALL_P, SOFT_DEPTH, Answer, InvalidRequest, SchemaError, ToolCall
from combee.sim.generic.compiled import CompiledSchema, compile_schema, compiled_schema
from combee.sim.generic.contract import conforms, forced_tool, within_contract
from combee.sim.generic.prose import prose
from combee.sim.generic.respond import generic_answer, requested_schema, truncate_answer, wants_json

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
