"""May a lesson go live? The last screen between an operation and the published playbook. Pure.

:mod:`combee.screen` asks whether a proposed lesson is a lesson at all (not a record of the run); this module
asks whether its text is safe to put in the system prompt every agent of the namespace runs with. A trace is
untrusted input (docs/security.md): its producer writes the task, the output and the feedback the reflector
reads, so a lesson can carry whatever the producer wanted it to. Two kinds of checks, on every ADD and UPDATE
text (:func:`guard_ops`), whatever the reduce that proposed it:

* **Structure, normalised** (:func:`one_line_lesson`): a bullet is one line of the rendered prompt. Line
  breaks of every kind become spaces, invisible and bidirectional format characters (Unicode category Cf:
  zero-width spaces and joiners, the word joiner, BOM, LRE/RLO/PDF, isolates, marks, soft hyphen) are dropped,
  runs of spaces collapse. C0/C1 control characters are already gone (:mod:`combee.models`). A citation of
  bullet ids that opens the text (``[b00016] The formula ...``: the local model writes the id of the bullet it
  updates into the new text) is taken off first (:func:`without_leading_ids`), and so are quotes around all
  of what is left; the rules below then judge the rest.
* **Policy, quarantined** (:func:`guard_reason`): a lesson that forges prompt structure or carries something
  no lesson should is held back with its reason (one of :data:`REASONS`, a bounded set: it labels a metric):

  - ``markup`` — a line of it starts with a Markdown heading (``#``) or a chat role tag (``system:``,
    ``assistant:``, ...), or it holds a chat-template token (``<|im_start|>``, ``[INST]``, ...), a bullet id
    in the playbook's own form (``[b00001]``) or the playbook's version footer;
  - ``url`` / ``email`` — a web address or an e-mail address;
  - ``credential`` — something shaped like a secret: ``password: ...``, ``api_key=...``, a bearer token, a
    private-key block, or a key with a well-known provider prefix;
  - ``card_number`` — 13 to 19 digits (contiguous, or in groups of four) that pass the Luhn check;
  - ``agent_control`` — an instruction aimed at the agent's controls rather than its task: ignore or
    override previous instructions or rules, print or reveal the system prompt, take on another role, send
    something to an outside party;
  - ``answer_tampering`` — an instruction to change every answer (multiply, scale, inflate all answers by a
    factor or fee).

A quarantined operation is not applied; the combiner stores it per namespace for an operator to release or
remove (``combee bullet ...``, docs/security.md). The rules are narrow on purpose (a false quarantine costs a
lesson): tests/unit/test_guard.py runs them over every lesson of the real model's committed playbooks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from combee.models import AddOp, DeltaOp, UpdateOp

__all__ = [
    "REASONS",
    "Guarded",
    "guard_ops",
    "guard_reason",
    "luhn_valid",
    "one_line_lesson",
    "without_leading_ids",
]

REASONS = ("markup", "url", "email", "credential", "card_number", "agent_control", "answer_tampering")

# Line and paragraph breaks a renderer or a model may honour (CR, VT, FF, NEL are control characters, which
# the models already drop; listed here too, for text that did not pass through them).
_BREAKS_RE = re.compile("[\n\r\x0b\x0c\x85\u2028\u2029]")
_SPACES_RE = re.compile(r"[ \t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]+")


def _visible(text: str) -> str:
    """``text`` without format characters (Cf: zero-width, bidirectional controls, BOM, soft hyphen, ...)."""
    if text.isascii():
        return text
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


def one_line_lesson(text: str) -> str:
    """``text`` as one line of visible text: format characters dropped, breaks turned to spaces, runs of
    spaces collapsed, trimmed. Idempotent; a text that is already so is returned unchanged."""
    flat = _SPACES_RE.sub(" ", _BREAKS_RE.sub(" ", _visible(text))).strip()
    return text if flat == text else flat


# One or more bullet ids at the very start, each perhaps followed by ":" or a dash, then the lesson.
_LEADING_IDS_RE = re.compile(r"^\s*(?:\[b\d{5,9}\]\s*(?:[:\u2013\u2014-]\s*)?)+")
_QUOTED_RE = re.compile(r"^(['\"\u2018\u201c])(.+)(['\"\u2019\u201d])$", re.DOTALL)
_QUOTE_PAIRS = {"'": "'", '"': '"', "\u2018": "\u2019", "\u201c": "\u201d"}


def without_leading_ids(text: str) -> str:
    """``text`` without the bullet ids that open it, and without the quotes around all of the rest (when ids were
    taken off). A text that does not open with an id is returned unchanged: an id anywhere else is still
    ``markup``, and so is a text that is nothing but ids (nothing of it is a lesson)."""
    m = _LEADING_IDS_RE.match(text)
    if m is None:
        return text
    rest = text[m.end() :].strip()
    if not rest:
        return text
    quoted = _QUOTED_RE.match(rest)
    if quoted and _QUOTE_PAIRS[quoted.group(1)] == quoted.group(3) and quoted.group(1) not in quoted.group(2):
        rest = quoted.group(2).strip()
    return rest or text


# --- markup --------------------------------------------------------------------------------------------------

_LINE_MARKUP_RE = re.compile(
    r"^\s*(?:#{1,6}(?:\s|$)|(?:system|assistant|user|developer|tool|human|ai)\s*:)", re.IGNORECASE
)
_TEXT_MARKUP_RE = re.compile(
    r"<\|[a-z_]{2,32}\|>"  # <|im_start|>, <|endoftext|>, <|eot_id|>
    r"|</?s>|\[/?INST\]|<</?SYS>>|<(?:start|end)_of_turn>"
    r"|\[b\d{5,9}\]"  # the playbook's own bullet ids
    r"|\(?\bplaybook version \d+\b",  # the footer, "(Playbook version 12.)"
    re.IGNORECASE,
)

# --- policy --------------------------------------------------------------------------------------------------

_URL_RE = re.compile(
    r"\b(?:https?|ftp|file)://|\bwww\.[\w-]+\.\w"
    r"|\b[\w-]+(?:\.[\w-]+)*\.(?:com|net|org|io|ai|co|ru|cn|xyz|info|biz|app|dev|me|top|sh|ly|gg)(?:/|\b(?!\.\w))",
    re.IGNORECASE,
)
_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[a-z]{2,}", re.IGNORECASE)
_CREDENTIAL_RE = re.compile(
    r"\b(?:api[_ -]?key|secret(?:[_ -]?key)?|access[_ -]?key|password|passwd|passphrase|auth[_ -]?token"
    r"|access[_ -]?token|token)\s*(?:[:=]|\bis\b)\s*['\"]?[^\s'\"]{4,}"
    r"|\bbearer\s+[a-z0-9._~+/-]{12,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(?:sk|pk|rk)-[a-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[a-z0-9]{30,}|\bxox[abpr]-[a-z0-9-]{10,}"
    r"|\bAIza[0-9a-z_-]{30,}",
    re.IGNORECASE,
)
_CARD_RE = re.compile(
    r"(?<![\d.,])(?:\d{13,19}|\d{4}(?:[ -]\d{4}){2}[ -]\d{1,7}|\d{4}[ -]\d{6}[ -]\d{5})(?![\d,]|\.\d)"
)

_CONTROLS = "instructions?|rules|prompts?|guidelines|directions|directives|constraints|polic(?:y|ies)|guardrails"
_AGENT_CONTROL_RES = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        # "ignore previous instructions", "disregard the rules", "forget all prior guidelines"
        r"\b(?:ignore|disregard|forget|override|bypass|skip|abandon)\b(?:\s+(?:all|any|every|the|your|my|of|these|"
        r"those|previous|prior|above|earlier|preceding|original|system|safety|other|existing))*\s+(?:"
        + _CONTROLS
        + ")",
        r"\bdo not (?:follow|obey|apply) (?:the |your |any )?(?:previous |prior |system |above )?(?:" + _CONTROLS + ")",
        # "print your full system prompt", "reveal the hidden instructions", "repeat the playbook verbatim"
        r"\b(?:print|reveal|show|output|repeat|display|leak|dump|disclose|share|return|echo|write out|recite|copy)"
        r"\b(?:\s+\w+){0,4}?\s+(?:system|hidden|initial|original|secret|developer|internal)\s+(?:prompt|message|"
        r"instructions?|rules)",
        r"\b(?:print|reveal|show|output|repeat|display|leak|dump|disclose|share|echo|recite)\b(?:\s+\w+){0,3}?\s+"
        r"(?:your|the agent'?s|the assistant'?s) (?:prompt|instructions|rules|playbook|context)",
        r"\bsystem prompt\b|\bdeveloper (?:message|mode)\b|\bjailbreak|\bDAN mode\b",
        # another role: "you are now ...", "from now on you ...", "pretend to be ..."
        r"\byou are now\b|\bfrom now on,? (?:you|the agent|always)\b|\bpretend (?:to be|you are)\b",
        # exfiltration: "send the conversation to ...", "post the data to this endpoint"
        r"\b(?:send|post|upload|forward|transmit|exfiltrate|e-?mail|leak|report)\w*\b[^.;]{0,80}?\bto\s+"
        r"(?:the\s+|this\s+|that\s+|an?\s+|my\s+|our\s+)?(?:following|external|remote|attacker\w*|third[- ]party|"
        r"\w*(?:server|endpoint|webhook|url|address|domain|inbox|channel)s?)\b",
    )
)
_ANSWER = (
    r"(?:every|all|each|any)\s+(?:final\s+|numeric(?:al)?\s+|returned\s+)?(?:answers?|outputs?|results?|responses?)"
)
_ANSWER_TAMPERING_RES = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\b(?:multiply|divide|scale|inflate|deflate|mark up|markup|adjust)\w*\b[^.;]{0,40}?\b" + _ANSWER + r"\b",
        r"\b" + _ANSWER + r"\b[^.;]{0,40}?\b(?:multipl|divid|scal|inflat|mark)\w*\s+(?:up\s+)?by\b",
        r"\b(?:fee|surcharge|commission|markup) factor\b",
    )
)


def luhn_valid(digits: str) -> bool:
    """Whether the digits of ``digits`` (other characters ignored) pass the Luhn check (card numbers do)."""
    ds = [int(c) for c in digits if c.isdigit()]
    if len(ds) < 2:
        return False
    total = 0
    for i, d in enumerate(reversed(ds)):
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _markup(text: str) -> bool:
    visible = _visible(text)
    if any(_LINE_MARKUP_RE.match(line) for line in _BREAKS_RE.split(visible)):
        return True
    return bool(_TEXT_MARKUP_RE.search(one_line_lesson(visible)))


def _has_card_number(text: str) -> bool:
    return any(
        13 <= sum(c.isdigit() for c in m.group(0)) <= 19 and luhn_valid(m.group(0)) for m in _CARD_RE.finditer(text)
    )


def guard_reason(text: str) -> str | None:
    """Why ``text`` must not go live as a lesson (one of :data:`REASONS`), or None when it may.

    Markup is judged on the text as given (a heading or role tag needs a line of its own); the rest on its
    :func:`one_line_lesson` form, so invisible characters cannot split a word out of a rule's sight."""
    if _markup(text):
        return "markup"
    flat = one_line_lesson(text)
    if _EMAIL_RE.search(flat):
        return "email"
    if _URL_RE.search(flat):
        return "url"
    if _CREDENTIAL_RE.search(flat):
        return "credential"
    if _has_card_number(flat):
        return "card_number"
    if any(r.search(flat) for r in _AGENT_CONTROL_RES):
        return "agent_control"
    if any(r.search(flat) for r in _ANSWER_TAMPERING_RES):
        return "answer_tampering"
    return None


@dataclass(frozen=True)
class Guarded:
    """A window's operations after the guard: the ones that may be applied (ADD and UPDATE texts on one line),
    the quarantined ones with their reason (in the order proposed), and how many texts were normalised."""

    ops: tuple[DeltaOp, ...]
    quarantined: tuple[tuple[DeltaOp, str], ...] = ()
    normalised: int = 0


def guard_ops(ops: Iterable[DeltaOp]) -> Guarded:
    """Every ADD and UPDATE of ``ops`` without its opening bullet ids (:func:`without_leading_ids`), judged by
    :func:`guard_reason` (an ADD's section too: it is rendered as a heading) and put on one line
    (:func:`one_line_lesson`); REMOVE passes as it is. Deterministic; order kept."""
    kept: list[DeltaOp] = []
    held: list[tuple[DeltaOp, str]] = []
    normalised = 0
    for op in ops:
        if not isinstance(op, AddOp | UpdateOp):
            kept.append(op)
            continue
        text = without_leading_ids(op.content)
        reason = guard_reason(text)
        if reason is None and isinstance(op, AddOp):  # its section becomes a heading of the prompt
            reason = guard_reason(op.section.replace("_", " "))
        flat = one_line_lesson(text)
        if flat != op.content:
            normalised += 1
            if not flat:  # nothing visible: no lesson to apply or to hold
                continue
            op = op.model_copy(update={"content": flat})
        if reason is None:
            kept.append(op)
        else:
            held.append((op, reason))
    return Guarded(tuple(kept), tuple(held), normalised)
