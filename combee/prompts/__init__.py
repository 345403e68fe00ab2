"""Prompts are data: pure rendering of requests and parsing of answers for every role.

``templates`` (the text of every prompt), ``schemas`` (the JSON schema of every answer), ``render`` (data into
named blocks, sized to the context), ``asks`` (a request, its re-ask and the parser that agrees with its
schema), ``extract`` (the JSON object in an answer) and ``parse`` (answers into typed values).
"""

from combee.prompts.asks import (
    RETRY_TEMPERATURES,
    Ask,
    curator_ask,
    curator_request,
    generator_ask,
    generator_request,
    merger_ask,
    merger_request,
    reflector_ask,
    reflector_request,
)
from combee.prompts.extract import load_object
from combee.prompts.parse import (
    MergeAnswer,
    Parsed,
    Proposal,
    parse_answer,
    parse_merge,
    parse_operations,
    parse_reflection,
    read_merge,
    read_operations,
    read_reflection,
    resolve_merge,
)
from combee.prompts.render import PlaybookView, data_json, fit_payload, playbook_view
from combee.prompts.schemas import LESSON_PATTERN, curator_schema, generator_schema, merger_schema, reflector_schema
from combee.prompts.templates import DEFAULT_PROMPTS, PromptSet, validate_templates

__all__ = [
    "DEFAULT_PROMPTS",
    "LESSON_PATTERN",
    "RETRY_TEMPERATURES",
    "Ask",
    "MergeAnswer",
    "Parsed",
    "PlaybookView",
    "PromptSet",
    "Proposal",
    "curator_ask",
    "curator_request",
    "curator_schema",
    "data_json",
    "fit_payload",
    "generator_ask",
    "generator_request",
    "generator_schema",
    "load_object",
    "merger_ask",
    "merger_request",
    "merger_schema",
    "parse_answer",
    "parse_merge",
    "parse_operations",
    "parse_reflection",
    "playbook_view",
    "read_merge",
    "read_operations",
    "read_reflection",
    "reflector_ask",
    "reflector_request",
    "reflector_schema",
    "resolve_merge",
    "validate_templates",
]
