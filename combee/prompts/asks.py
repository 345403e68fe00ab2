"""Asks: a request, how to re-ask, and the parser that agrees with its schema, for every role.

**A schema and its parser agree.** Every request carries a JSON schema built for that request: bullet ids are
an ``enum`` of the ids shown in its playbook block (no tag array, and no UPDATE/REMOVE, when none are shown),
proposal ids an ``enum`` of the proposals listed, lesson texts the parser's own bounds. An :class:`Ask` pairs
the request with the parser made from the same ids, so whatever a grammar-constrained server lets the model
write, the parser accepts (``tests/unit/test_schema_agreement.py`` checks it both ways).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from combee.errors import ContextTooSmall
from combee.llm import ChatMessage, ChatRequest, Role
from combee.models import (
    LIMITS,
    AddOp,
    DeltaOp,
    Playbook,
    Reflection,
    RemoveOp,
    Trace,
    UpdateOp,
)
from combee.prompts.parse import (
    MergeAnswer,
    Parsed,
    Proposal,
    parse_answer,
    read_merge,
    read_operations,
    read_reflection,
)
from combee.prompts.render import (
    PlaybookView,
    chat_messages,
    data_json,
    escape_markup,
    fit_payload,
    fit_to_context,
    message_contents,
    outcome_text,
    playbook_view,
    trace_payload,
)
from combee.prompts.schemas import curator_schema, generator_schema, merger_schema, reflector_schema
from combee.prompts.templates import DEFAULT_PROMPTS, PromptSet
from combee.sections import DEFAULT_SECTIONS, NEW_SECTION_PREFIX, section_choices
from combee.sizing import CHARS_PER_TOKEN, MARGIN_TOKENS, completion_budget, prompt_tokens

T = TypeVar("T")

__all__ = [
    "CURATOR_EDITS_OF_SHOWN",
    "CURATOR_OPS_PER_INSIGHT",
    "CURATOR_TOKENS",
    "GENERATOR_TASK_RESERVE",
    "GENERATOR_TOKENS",
    "MERGER_TOKENS",
    "REFLECTOR_TOKENS",
    "REPAIR_ECHO_CHARS",
    "RETRY_TEMPERATURES",
    "Ask",
    "curator_ask",
    "curator_op_bound",
    "curator_request",
    "generator_ask",
    "generator_request",
    "merger_ask",
    "merger_request",
    "offered_sections",
    "reflector_ask",
    "reflector_request",
]


REPAIR_ECHO_CHARS = 1500
"""How much of a rejected answer a repair turn shows the model (its start: where the problem usually is)."""


RETRY_TEMPERATURES: tuple[float, ...] = (0.0, 0.3, 0.7)
"""Temperature per attempt (the last repeats): a re-ask at temperature 0 would mostly repeat itself."""


@dataclass(frozen=True)
class Ask(Generic[T]):
    """One role call: its first request, the parser that agrees with the request's schema, and how to re-ask.

    ``parse`` returns :class:`Parsed` or raises :class:`LLMParseError`. :meth:`again` builds a later attempt.
    """

    request: ChatRequest
    parse: Callable[[str], Parsed[T]]
    context_tokens: int | None = None
    wanted_tokens: int = 1024
    minimum_tokens: int = 256
    prompts: PromptSet = DEFAULT_PROMPTS

    @property
    def role(self) -> Role:
        return self.request.role

    def again(
        self,
        attempt: int,
        *,
        temperature: float,
        answer: str | None = None,
        problem: str | None = None,
    ) -> ChatRequest:
        """Attempt ``attempt`` (1-based count of earlier attempts): a repair turn when ``problem`` is given.

        The repair turn is the rejected ``answer`` (its first :data:`REPAIR_ECHO_CHARS` characters) as the
        assistant's message, then a user message stating ``problem``. When that does not fit the context, the
        echo is left out; when not even the problem fits, the original request is re-sent. ``max_tokens`` is
        re-sized for the longer prompt; ``seed`` and ``temperature`` change so the re-ask is a new request.
        """
        base = self.request.messages
        candidates: list[tuple[ChatMessage, ...]] = []
        if problem is not None:
            repair = ChatMessage(role="user", content=self.prompts.repair_user.format(problem=problem))
            if answer:
                echo = answer if len(answer) <= REPAIR_ECHO_CHARS else answer[:REPAIR_ECHO_CHARS] + " …"
                candidates.append((*base, ChatMessage(role="assistant", content=echo), repair))
            candidates.append((*base, repair))
        candidates.append(base)
        for messages in candidates:
            try:
                max_tokens = completion_budget(
                    self.context_tokens,
                    prompt_tokens(message_contents(messages)),
                    self.wanted_tokens,
                    minimum=self.minimum_tokens,
                )
            except ContextTooSmall:
                if messages is base:
                    raise
                continue
            return self.request.model_copy(
                update={"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "seed": attempt}
            )
        raise AssertionError("unreachable: the base request was sized when it was built")


def offered_sections(defaults: Sequence[str], playbook: Playbook, shown: Sequence[str] = ()) -> tuple[str, ...]:
    """The sections a request offers: ``defaults``, the playbook's own and those of the lessons it shows
    (``shown``: already canonical, and maybe opened in this window) (:func:`section_choices`)."""
    return section_choices(defaults, (*playbook.sections, *shown))


def _sections_text(sections: Sequence[str]) -> str:
    return ", ".join(sections) + f' (or "{NEW_SECTION_PREFIX} <name>" when none fits)'


REFLECTOR_TOKENS = (1200, 512)  # (wanted, minimum) completion tokens per role


CURATOR_TOKENS = (4000, 768)


MERGER_TOKENS = (4000, 512)


GENERATOR_TOKENS = (700, 384)


GENERATOR_TASK_RESERVE = 600
"""Tokens a generator task is counted as at least, so the playbook prefix is the same for every short task."""


def reflector_ask(
    trace: Trace,
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    max_tokens: int = REFLECTOR_TOKENS[0],
    context_tokens: int | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> Ask[Reflection]:
    """Reflect on ``trace`` against ``playbook`` (the bullets that fit ``context_tokens``, when given),
    offering ``sections`` and the playbook's own."""
    system = prompts.reflector_system.format(max_insights=LIMITS.insights_per_reflection)
    payload = trace_payload(trace)
    trace_json = data_json(payload)
    outcome = outcome_text(trace, prompts)
    choices = offered_sections(sections, playbook)

    def build(view: PlaybookView) -> tuple[ChatMessage, ...]:
        reply = prompts.reflector_reply_tags if view.shown else prompts.reflector_reply_plain
        user = prompts.reflector_user.format(
            playbook=escape_markup(view.text(prompts, data=True)),
            trace=trace_json,
            outcome=outcome,
            sections=_sections_text(choices),
            reply=reply.format(),
        )
        return chat_messages(system, user)

    minimum = REFLECTOR_TOKENS[1]
    if context_tokens is not None:
        # A trace may be longer than the model's context (traces are bounded in characters, models in
        # tokens): the run record gives up its middle first, so the request is sent instead of refused.
        whole = trace_json
        trace_json = ""
        fixed = prompt_tokens(message_contents(build(playbook_view(playbook, ()))))
        room_chars = int((context_tokens - fixed - min(minimum, max_tokens) - MARGIN_TOKENS) * CHARS_PER_TOKEN)
        trace_json = whole
        if len(whole) > room_chars > 0:
            trace_json = data_json(fit_payload(payload, room_chars)[0])
    view, messages, budget = fit_to_context(
        playbook, build, context_tokens, wanted=max_tokens, minimum=minimum, data=True
    )
    ids = view.ids
    request = ChatRequest(
        role=Role.REFLECTOR,
        messages=messages,
        schema_name="combee_reflection",
        json_schema=reflector_schema(ids, choices),
        max_tokens=budget,
    )
    return Ask(
        request,
        lambda text: read_reflection(text, trace.trace_id, playbook.version, bullet_ids=ids, sections=choices),
        context_tokens,
        max_tokens,
        minimum,
        prompts,
    )


def reflector_request(
    trace: Trace,
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    attempt: int = 0,
    max_tokens: int = REFLECTOR_TOKENS[0],
    context_tokens: int | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> ChatRequest:
    """The first request of :func:`reflector_ask` (``attempt`` > 0 only changes the seed)."""
    request = reflector_ask(
        trace, playbook, prompts, max_tokens=max_tokens, context_tokens=context_tokens, sections=sections
    ).request
    return request.model_copy(update={"seed": attempt or None})


def _reflection_payload(ref: str, r: Reflection) -> dict[str, Any]:
    out: dict[str, Any] = {"ref": ref}
    if r.diagnosis:
        out["diagnosis"] = r.diagnosis
    out["insights"] = [{"section": i.section, "content": i.content} for i in r.insights]
    if r.tags:
        out["tags"] = {t.bullet_id: t.tag.value for t in r.tags}
    return out


CURATOR_OPS_PER_INSIGHT = 1


CURATOR_EDITS_OF_SHOWN = 4


def curator_op_bound(reflections: Sequence[Reflection], bullet_ids: Sequence[str]) -> int:
    """The most operations a curator answer may hold: one per insight offered, plus a few edits (UPDATE/REMOVE)
    of shown bullets; never more than the parser's limit."""
    insights = sum(len(r.insights) for r in reflections)
    edits = min(len(bullet_ids), CURATOR_EDITS_OF_SHOWN)
    return max(1, min(LIMITS.ops_per_llm_answer, CURATOR_OPS_PER_INSIGHT * insights + edits))


def curator_ask(
    reflections: Sequence[Reflection],
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    max_tokens: int = CURATOR_TOKENS[0],
    context_tokens: int | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> Ask[tuple[DeltaOp, ...]]:
    """One curator call over ``reflections`` (listed in the given order as r1, r2, ...); every operation cites
    the refs it comes from, and is parsed with the traces of those reflections as its ``sources``."""
    refs = {f"r{i + 1}": r.trace_id for i, r in enumerate(reflections)}
    lines = "\n".join(data_json(_reflection_payload(ref, r)) for ref, r in zip(refs, reflections, strict=True))
    system = prompts.curator_system.format(max_ops=LIMITS.ops_per_llm_answer)
    choices = offered_sections(sections, playbook, [i.section for r in reflections for i in r.insights])

    def build(view: PlaybookView) -> tuple[ChatMessage, ...]:
        reply = prompts.curator_reply_all_ops if view.shown else prompts.curator_reply_add_only
        user = prompts.curator_user.format(
            playbook=escape_markup(view.text(prompts, data=True)),
            count=len(reflections),
            reflections=lines,
            sections=_sections_text(choices),
            reply=reply.format(),
        )
        return chat_messages(system, user)

    minimum = CURATOR_TOKENS[1]
    view, messages, budget = fit_to_context(
        playbook, build, context_tokens, wanted=max_tokens, minimum=minimum, data=True
    )
    ids = view.ids
    request = ChatRequest(
        role=Role.CURATOR,
        messages=messages,
        schema_name="combee_operations",
        json_schema=curator_schema(ids, tuple(refs), choices, max_ops=curator_op_bound(reflections, ids)),
        max_tokens=budget,
    )
    return Ask(
        request,
        lambda text: read_operations(text, bullet_ids=ids, sections=choices, refs=refs),
        context_tokens,
        max_tokens,
        minimum,
        prompts,
    )


def curator_request(
    reflections: Sequence[Reflection],
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    attempt: int = 0,
    max_tokens: int = CURATOR_TOKENS[0],
    context_tokens: int | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> ChatRequest:
    """The first request of :func:`curator_ask` (``attempt`` > 0 only changes the seed)."""
    request = curator_ask(
        reflections, playbook, prompts, max_tokens=max_tokens, context_tokens=context_tokens, sections=sections
    ).request
    return request.model_copy(update={"seed": attempt or None})


def _op_payload(op: DeltaOp) -> dict[str, Any]:
    if isinstance(op, AddOp):
        return {"op": "ADD", "section": op.section, "content": op.content}
    if isinstance(op, UpdateOp):
        return {"op": "UPDATE", "bullet_id": op.bullet_id, "content": op.content}
    return {"op": "REMOVE", "bullet_id": op.bullet_id}


def merger_ask(
    proposals: Sequence[Proposal],
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    max_tokens: int = MERGER_TOKENS[0],
    context_tokens: int | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> Ask[MergeAnswer]:
    """One merge call selecting among ``proposals``."""
    lines = "\n".join(data_json({"id": p.id, **_op_payload(p.op)}) for p in proposals)
    choices = offered_sections(sections, playbook, [p.op.section for p in proposals if isinstance(p.op, AddOp)])
    proposal_ids = tuple(p.id for p in proposals)
    referenced = [op.bullet_id for p in proposals if isinstance(op := p.op, UpdateOp | RemoveOp)]

    def target_ids(view: PlaybookView) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*view.ids, *referenced]))

    def build(view: PlaybookView) -> tuple[ChatMessage, ...]:
        reply = prompts.merger_reply_all_ops if target_ids(view) else prompts.merger_reply_add_only
        user = prompts.merger_user.format(
            playbook=escape_markup(view.text(prompts, data=True)),
            count=len(proposals),
            proposals=lines,
            sections=_sections_text(choices),
            reply=reply.format(),
        )
        return chat_messages(prompts.merger_system, user)

    minimum = MERGER_TOKENS[1]
    view, messages, budget = fit_to_context(
        playbook, build, context_tokens, wanted=max_tokens, minimum=minimum, data=True
    )
    bullet_ids = target_ids(view)
    request = ChatRequest(
        role=Role.MERGER,
        messages=messages,
        schema_name="combee_merge",
        json_schema=merger_schema(proposal_ids, bullet_ids, choices),
        max_tokens=budget,
    )
    return Ask(
        request,
        lambda text: read_merge(text, proposal_ids=proposal_ids, bullet_ids=bullet_ids, sections=choices),
        context_tokens,
        max_tokens,
        minimum,
        prompts,
    )


def merger_request(
    proposals: Sequence[Proposal],
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    attempt: int = 0,
    max_tokens: int = MERGER_TOKENS[0],
    context_tokens: int | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> ChatRequest:
    """The first request of :func:`merger_ask` (``attempt`` > 0 only changes the seed)."""
    request = merger_ask(
        proposals, playbook, prompts, max_tokens=max_tokens, context_tokens=context_tokens, sections=sections
    ).request
    return request.model_copy(update={"seed": attempt or None})


def generator_ask(
    task: str,
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    max_tokens: int = GENERATOR_TOKENS[0],
    context_tokens: int | None = None,
) -> Ask[str]:
    """Answer ``task`` as the agent. The playbook opens the system message, byte-identical for every task
    short enough (up to :data:`GENERATOR_TASK_RESERVE` tokens), so a server's prompt cache reuses it."""
    user = prompts.generator_user.format(task=data_json(task))
    reserve = max(0, GENERATOR_TASK_RESERVE - prompt_tokens([user]))

    def build(view: PlaybookView) -> tuple[ChatMessage, ...]:
        if not playbook.bullets:  # nothing learned yet: a prompt that says nothing about a playbook
            return chat_messages(prompts.generator_system_empty.format(), user)
        return chat_messages(prompts.generator_system.format(playbook=view.text(prompts)), user)

    minimum = GENERATOR_TOKENS[1]
    _, messages, budget = fit_to_context(
        playbook, build, context_tokens, wanted=max_tokens, minimum=minimum, reserve=reserve
    )
    request = ChatRequest(
        role=Role.GENERATOR,
        messages=messages,
        schema_name="combee_answer",
        json_schema=generator_schema(),
        max_tokens=budget,
    )
    return Ask(request, lambda text: Parsed(parse_answer(text)), context_tokens, max_tokens, minimum, prompts)


def generator_request(
    task: str,
    playbook: Playbook,
    prompts: PromptSet = DEFAULT_PROMPTS,
    *,
    max_tokens: int = GENERATOR_TOKENS[0],
    context_tokens: int | None = None,
) -> ChatRequest:
    """The request of :func:`generator_ask`."""
    return generator_ask(task, playbook, prompts, max_tokens=max_tokens, context_tokens=context_tokens).request
