"""Generic answers for requests the world model does not recognise — schema-valid, seeded, cheap.

``answer`` (what an answer is), ``prose``, ``schemas`` (a JSON schema compiled into a generator of instances of its
shape, and the invalid instances it draws), ``respond`` (a request → its generic answer) and ``contract``
(whether an answer keeps to its request).

It is more general than Combee's own requests (four schemas, no tools) on purpose, and no more general than the
contract it must honour for other clients (issue 12, item 7): a forced tool call and a ``response_format`` schema of
another client, typically written by pydantic. :mod:`combee.sim.generic.schemas` lists what that takes.
"""

from combee.sim.generic.answer import AUTO_TOOL_CALL_P, SOFT_DEPTH, Answer, InvalidRequest, SchemaError, ToolCall
from combee.sim.generic.contract import conforms, forced_tool, within_contract
from combee.sim.generic.prose import prose
from combee.sim.generic.respond import generic_answer, requested_schema, truncate_answer, wants_json
from combee.sim.generic.schemas import CompiledSchema, compile_schema, compiled_schema

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
