"""SIMULATED world model: synthetic traces with hidden insights, and how a simulated model answers prompts.

Everything in this module is a simulation, labelled as such wherever it is used. It stands in for a real
LLM so that the method can be exercised, timed and compared on a machine with no model. The model is
documented in ``docs/simulator.md``; in short:

* **World.** A domain has ``universe`` hidden insights. Insight ``i`` has a key (``FX-0042``), a section and
  three phrasings, all generated deterministically from the key. Traces are drawn with Zipf popularity over
  insights: each synthetic run failed (or succeeded) for a reason that one insight explains, and the run's
  grader note names the rule key — the stand-in for the understanding a real model would get from reading it.
* **Reflector.** Reading a trace, it recovers the trace's insight with probability ``recover_prob`` (writing
  one of its phrasings, key included) and adds a generic tip with probability ``generic_prob``. It tags the
  playbook bullets carrying the trace's key as helpful. Draws are keyed on the trace text (common random
  numbers): the same trace gives the same reflection whatever the playbook or the method.
* **Curator (summarise).** Shown m reflections, it writes at most ``K(m) = capacity_coef · m^capacity_exp``
  operations (stochastically rounded): context overload. New specific insights go first (the ones mentioned
  most), but an overloaded curator (more candidates than capacity) first writes one generic tip. With room to
  spare it re-adds known insights in other words (``near_dup_prob``) or refines them (``update_prob``).
* **Merger (select).** Shown proposed operations, it keeps one operation per new insight (combining repeats),
  drops most re-statements of insights the playbook already has, keeps distinct generic tips and valid
  UPDATE/REMOVEs, each with probability ``merge_keep``. A merge consolidates items too, so the curator's
  overload law applies to it: shown m proposals it keeps at most ``merge_capacity_factor · K(m)`` of them
  (most-repeated new insights first; overloaded, a generic tip first). Factor 1 = a merge overloads exactly
  like a curator call; ``None`` = unlimited (the merger of issue 3, which kept ~97 % of proposals).
* **Generator.** Answers a test task correctly with probability ``informed_accuracy`` when the system prompt
  contains the task's insight key, ``base_accuracy`` otherwise (common random numbers per task).

The model answers prompts; it never knows which method sent them. Its task is recognised from the data
blocks of the prompt (``<trace>``, ``<reflections>``, ``<proposals>``, ``<task>``), like any reader would.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from combee.sim.protocol import SimRequest
from combee.sim.reading import BULLET_RE, as_offered, json_lines, lesson_text, offered_sections, tagged_block

__all__ = [
    "ACTIONS",
    "DOCS",
    "GENERIC_HEADS",
    "GENERIC_TAILS",
    "METRICS",
    "WORLDS",
    "Behaviour",
    "TestTask",
    "World",
    "WorldResponder",
    "generate_traces",
    "insight_keys_in",
    "seeded_pick",
]

_T = TypeVar("_T")

SIMULATED_LABEL = "SIMULATED (Combee simulator; not a real model)"


@dataclass(frozen=True)
class World:
    """A synthetic domain: how many hidden insights, their popularity, and the vocabulary of its tasks."""

    name: str
    prefix: str
    universe: int
    zipf_s: float
    success_rate: float = 0.3

    def key(self, i: int) -> str:
        return f"{self.prefix}-{i:04d}"


WORLDS: dict[str, World] = {
    "formula": World(name="formula", prefix="FX", universe=120, zipf_s=0.6),
    "finer": World(name="finer", prefix="FN", universe=150, zipf_s=0.75),
}
_WORLD_BY_PREFIX = {w.prefix: w for w in WORLDS.values()}
_KEY_RE = re.compile(r"\b(FX|FN)-(\d{4})\b")


@dataclass(frozen=True)
class Behaviour:
    """How the simulated model behaves; defaults are the calibrated ones (see docs/simulator.md)."""

    recover_prob: float = 0.75
    generic_prob: float = 0.3
    harmful_tag_prob: float = 0.03
    # (m reflections, operations written): the paper's Formula naive-batch entries per curator call
    # (264/500, 199/100, 121/50, 97/25, 47/10, 21/5 → 1, 5, 10, 20, 50, 100), interpolated log-linearly.
    capacity_points: tuple[tuple[int, float], ...] = (
        (1, 1.5),
        (5, 1.99),
        (10, 2.42),
        (20, 3.88),
        (50, 4.7),
        (100, 4.2),
    )
    generic_drift_m: float = 30.0
    near_dup_prob: float = 0.45
    update_prob: float = 0.1
    merge_keep: float = 0.97
    merge_known_keep: float = 0.15
    # One overload law for every consolidating call: a merger shown m proposals writes at most
    # merge_capacity_factor · capacity(m). 1 = a merge overloads exactly like a curator call; None = unlimited.
    merge_capacity_factor: float | None = 1.0
    # calibrated to the paper's Formula accuracies: sequential 87.0, naive batch 100 72.5 (docs/simulator.md)
    base_accuracy: float = 0.66
    informed_accuracy: float = 0.88
    # How the reflector labels a lesson's section: "consistent" (the insight's own section, the same for every
    # trace of it), "random:N" (one of N world sections drawn per trace), "free" (a free-text label per trace,
    # as a model naming each lesson by its topic would). It takes an offered section when its label is one,
    # else opens it as "new: <label>" (combee.sections).
    labels: str = "consistent"
    seed: int = 0

    def __post_init__(self) -> None:
        mode, _, n = self.labels.partition(":")
        if mode not in ("consistent", "random", "free") or (mode == "random") != bool(n.isdigit() and int(n) > 0):
            raise ValueError(f"labels must be consistent, random:N or free; got {self.labels!r}")

    def label(self, key: str, trace_text: str) -> str:
        """The section label the reflector gives ``key``'s insight in a trace (a slug; see ``labels``)."""
        mode, _, n = self.labels.partition(":")
        if mode == "consistent":
            return insight_section(key)
        if mode == "random":
            return seeded_pick(_SECTIONS[: int(n)], self.seed, "label", trace_text)
        return f"topic {_h(self.seed, 'free-label', trace_text) % 10_000:04d}"

    def capacity(self, m: int) -> float:
        """Expected number of operations a curator writes when summarising ``m`` reflections.

        Log-linear interpolation between ``capacity_points``; beyond the last point the last segment's trend
        continues (for the defaults: slowly falling — more reflections, fewer operations).
        """
        pts = self.capacity_points
        x = math.log(max(1, m))
        for (m0, k0), (m1, k1) in itertools.pairwise(pts):
            if m <= m1 or (m1, k1) == pts[-1]:
                x0, x1 = math.log(m0), math.log(m1)
                t = (x - x0) / (x1 - x0)
                return float(math.exp(math.log(k0) + t * (math.log(k1) - math.log(k0))))
        return pts[-1][1]

    def consolidation_capacity(self, m: int, factor: float | None, rng: random.Random) -> float:
        """How many items a call consolidating ``m`` items may write: ``factor · capacity(m)``, stochastically
        rounded (one draw from ``rng``); ``inf`` when ``factor`` is None (no overload). The one law for the
        curator (factor 1) and the merger (factor ``merge_capacity_factor``)."""
        if factor is None:
            return math.inf
        return float(_stochastic_round(factor * self.capacity(m), rng))

    def drifts_generic(self, m: int, u: float) -> bool:
        """An overloaded curator of ``m`` reflections writes a generic tip first with prob m/(m+drift_m)."""
        return u < m / (m + self.generic_drift_m)


# --- vocabulary (deterministic content of insights and tasks) ---------------------------------------------

_SECTIONS = ("formulas", "units_and_scaling", "extraction", "pitfalls", "verification", "domain_facts")
METRICS = (
    "net margin", "EBITDA", "free cash flow", "current ratio", "debt-to-equity ratio", "diluted EPS",
    "effective tax rate", "operating leverage", "days sales outstanding", "return on equity",
    "interest coverage", "gross margin", "working capital", "book value per share", "dividend payout ratio",
    "inventory turnover", "revenue CAGR", "quick ratio", "capex intensity", "deferred revenue balance",
)  # fmt: skip
DOCS = (
    "10-K table", "quarterly statement", "cash-flow statement", "footnote", "segment report",
    "balance sheet", "XBRL fact list", "earnings release",
)  # fmt: skip
ACTIONS = (
    "divide by the average of the opening and closing balances, not the closing balance",
    "use the diluted share count of the same period",
    "convert figures reported in thousands to units before combining them",
    "exclude the one-off items listed in the footnote",
    "annualise quarterly flow figures by multiplying by four, but never stock figures",
    "round to two decimals only at the final step",
    "treat expenses shown in parentheses as negative numbers",
    "use the fiscal-year end date, not the filing date",
    "take the tax rate from the reconciliation table rather than recomputing it",
    "sum the segment values and check them against the consolidated total",
    "use the restated prior-year figure when both original and restated values appear",
    "report the ratio as a percentage with the % sign only if the question asks for one",
    "subtract capitalised software costs before computing free cash flow",
    "read the unit from the column header, since row labels omit it",
    "prefer the GAAP figure over the adjusted one unless the question says adjusted",
)  # fmt: skip
_COMPANIES = (
    "Acme Corp", "Borealis Ltd", "Cobalt Systems", "Dunmore Foods", "Estuary Energy", "Fjord Logistics",
    "Granite Health", "Halcyon Retail", "Ironbark Mining", "Juniper Media",
)  # fmt: skip
GENERIC_HEADS = (
    "Double-check", "Re-read", "Verify", "Confirm", "Check once more",
    "Before answering, review", "Always confirm", "Take a moment to check",
)  # fmt: skip
GENERIC_TAILS = (
    "the units of every figure", "which period the question asks about", "the arithmetic of the final step",
    "that the answer has the requested format", "the sign of each value",
)  # fmt: skip


def _h(*parts: object) -> int:
    data = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def _u(*parts: object) -> float:
    """Uniform [0, 1) draw keyed on ``parts`` (common random numbers)."""
    return _h(*parts) / 2**64


def seeded_pick(seq: Sequence[_T], *parts: object) -> _T:
    return seq[_h(*parts) % len(seq)]


PHRASINGS = 5


def insight_section(key: str) -> str:
    return seeded_pick(_SECTIONS, "section", key)


def insight_content(key: str, variant: int) -> str:
    metric, doc, action = (
        seeded_pick(METRICS, "metric", key),
        seeded_pick(DOCS, "doc", key),
        seeded_pick(ACTIONS, "act", key),
    )
    variant %= PHRASINGS
    if variant == 0:
        return f"When computing {metric} from a {doc}, {action} (rule {key})."
    if variant == 1:
        return f"For {metric} questions based on a {doc}: {action}. See rule {key}."
    if variant == 2:
        return f"Rule {key}: {action} whenever the {metric} comes from a {doc}."
    if variant == 3:
        return f"{metric[0].upper()}{metric[1:]} from a {doc}: remember to {action} ({key})."
    return f"A {doc} asking for {metric} means you must {action}; rule {key} applies."


def generic_tip(index: int) -> str:
    head = GENERIC_HEADS[index % len(GENERIC_HEADS)]
    tail = GENERIC_TAILS[(index // len(GENERIC_HEADS)) % len(GENERIC_TAILS)]
    return f"{head} {tail}."


GENERIC_POOL = len(GENERIC_HEADS) * len(GENERIC_TAILS)


def insight_keys_in(text: str) -> list[str]:
    """Insight keys mentioned in ``text``, in order of first mention, without repeats."""
    return list(dict.fromkeys(f"{m.group(1)}-{m.group(2)}" for m in _KEY_RE.finditer(text)))


def expected_answer(task: str) -> str:
    """The ground truth of a synthetic test task (a deterministic function of its text)."""
    return f"{(_h('answer', task) % 10_000_000) / 100:.2f}"


# --- trace generation -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestTask:
    task_id: str
    namespace: str
    task: str
    ground_truth: str
    insight: str


def _zipf_weights(world: World, seed_base: str) -> tuple[list[str], list[float]]:
    # Popularity ranks are a permutation of the keys, fixed per world, so key order says nothing.
    keys = [world.key(i) for i in range(world.universe)]
    ranked = sorted(keys, key=lambda k: _h("rank", world.name, seed_base, k))
    weights = [1.0 / (r + 1) ** world.zipf_s for r in range(len(ranked))]
    return ranked, weights


def _task_text(world: World, key: str, j: int, kind: str, seed: int) -> tuple[str, str, str, str]:
    metric = seeded_pick(METRICS, "metric", key)
    doc = seeded_pick(DOCS, "doc", key)
    company = seeded_pick(_COMPANIES, kind, seed, j)
    year = 2015 + _h("year", kind, seed, j) % 10
    task = f"From the {doc} of {company}, compute the {metric} for FY{year}. Give the value to two decimals."
    return task, metric, doc, company


def generate_traces(
    n: int, seed: int, *, namespace: str = "demo", world: str = "formula", test_n: int = 400
) -> tuple[list[dict[str, Any]], list[TestTask], dict[str, Any]]:
    """Synthetic traces (as JSON-ready dicts), a held-out test set and the ground truth (SIMULATED).

    The ground truth (``truth["insights"]`` and the insight of every trace) is for benchmarks only; the
    learner never sees it.
    """
    w = WORLDS[world]
    rng = random.Random(_h("traces", world, seed))
    keys, weights = _zipf_weights(w, "v1")
    traces: list[dict[str, Any]] = []
    trace_insights: dict[str, str] = {}
    for j in range(n):
        key = rng.choices(keys, weights)[0]
        task, metric, doc, _ = _task_text(w, key, j, f"train-{namespace}", seed)
        truth = expected_answer(task)
        success = rng.random() < w.success_rate
        wrong = f"{(_h('wrong', task) % 10_000_000) / 100:.2f}"
        steps = [
            {"kind": "thought", "content": f"I need the {metric}; the {doc} should have the inputs."},
            {"kind": "action", "content": f"lookup({doc!r}, {metric!r})"},
            {"kind": "observation", "content": f"Found the inputs for the {metric} in the {doc}."},
        ]
        if success:
            steps.append({"kind": "thought", "content": f"Applying rule {key} before the final computation."})
            message = f"Correct. The grader notes the run applied rule {key}."
        else:
            message = f"Incorrect: expected {truth}. The grader notes the run missed rule {key}."
        trace_id = f"{namespace}-{seed}-{j:06d}"
        traces.append(
            {
                "schema_version": 1,
                "trace_id": trace_id,
                "namespace": namespace,
                "task": task,
                "steps": steps,
                "output": truth if success else wrong,
                "feedback": {"score": 1.0 if success else 0.0, "success": success, "ground_truth": truth,
                             "message": message},
                "metadata": {"simulated": True, "world": world},
            }
        )  # fmt: skip
        trace_insights[trace_id] = key
    test_rng = random.Random(_h("tests", world, seed))
    tests: list[TestTask] = []
    for j in range(test_n):
        key = test_rng.choices(keys, weights)[0]
        task, *_ = _task_text(w, key, j, f"test-{namespace}", seed)
        task = f"{task} (case {key}, q{j})"
        tests.append(
            TestTask(
                task_id=f"{namespace}-test-{seed}-{j:05d}",
                namespace=namespace,
                task=task,
                ground_truth=expected_answer(task),
                insight=key,
            )
        )
    truth_doc = {
        "simulated": True,
        "world": world,
        "seed": seed,
        "namespace": namespace,
        "insights": sorted(set(trace_insights.values())),
        "trace_insights": trace_insights,
    }
    return traces, tests, truth_doc


# --- the responder --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Bullet:
    id: str
    content: str
    keys: tuple[str, ...]


def _playbook_bullets(text: str) -> list[_Bullet]:
    """The bullets of the ``<playbook>`` block, in id order whatever order the text lists them in (the layout
    is the prompt's business, not the simulated model's)."""
    shown = tagged_block(text, "playbook") or ""
    found = []
    for m in BULLET_RE.finditer(shown):
        content = lesson_text(m.group(2))
        found.append(_Bullet(m.group(1), content, tuple(insight_keys_in(content))))
    return sorted(found, key=lambda b: int(b.id[1:]))


def _stochastic_round(x: float, rng: random.Random) -> int:
    base = math.floor(x)
    return base + (1 if rng.random() < x - base else 0)


def _op(op: str, section: str | None = None, content: str | None = None, bullet_id: str | None = None) -> dict:
    # Only the fields the operation has, as the per-request schema (one shape per operation) asks.
    fields = {"op": op, "section": section, "content": content, "bullet_id": bullet_id}
    return {k: v for k, v in fields.items() if v is not None}


@dataclass
class WorldResponder:
    """The SIMULATED model for Combee's own prompts (see module docstring). Pure given the request."""

    behaviour: Behaviour = field(default_factory=Behaviour)

    def with_behaviour(self, **changes: Any) -> WorldResponder:
        return WorldResponder(replace(self.behaviour, **changes))

    def respond(self, request: SimRequest, rng: random.Random) -> str | None:
        user = request.text_of("user")
        if (trace := tagged_block(user, "trace")) is not None:
            return self._reflect(user, trace)
        if (reflections := tagged_block(user, "reflections")) is not None:
            return self._curate(user, reflections, rng)
        if (proposals := tagged_block(user, "proposals")) is not None:
            return self._merge(user, proposals, rng)
        if (task := tagged_block(user, "task")) is not None:
            return self._generate(request.text_of("system"), task)
        return None

    # reflector: common random numbers keyed on the trace text
    def _reflect(self, user: str, trace_block: str) -> str:
        b = self.behaviour
        offered = offered_sections(user)
        keys = [k for k in insight_keys_in(trace_block) if k[:2] in _WORLD_BY_PREFIX]
        insights: list[dict[str, str]] = []
        diagnosis = "The run gives no specific lesson."
        if keys:
            key = keys[0]
            if _u(b.seed, "recover", trace_block) < b.recover_prob:
                variant = _h(b.seed, "variant", trace_block) % PHRASINGS
                section = as_offered(b.label(key, trace_block), offered)
                insights.append({"section": section, "content": insight_content(key, variant)})
                diagnosis = f"The outcome hinges on rule {key}."
            else:
                diagnosis = "The run went wrong, but the cause is unclear from the record."
        if _u(b.seed, "generic", trace_block) < b.generic_prob:
            tip = generic_tip(_h(b.seed, "tip", trace_block) % GENERIC_POOL)
            insights.append({"section": as_offered("verification", offered), "content": tip})
        tags = []
        bullets = _playbook_bullets(user)
        for bullet in bullets:
            if keys and keys[0] in bullet.keys:
                tags.append({"bullet_id": bullet.id, "tag": "helpful"})
        if bullets and _u(b.seed, "harmful", trace_block) < b.harmful_tag_prob:
            victim = bullets[_h(b.seed, "victim", trace_block) % len(bullets)]
            if not any(t["bullet_id"] == victim.id for t in tags):
                tags.append({"bullet_id": victim.id, "tag": "harmful"})
        if not bullets:  # nothing shown to tag: the request's schema has no tag list
            return json.dumps({"diagnosis": diagnosis, "insights": insights})
        return json.dumps({"diagnosis": diagnosis, "insights": insights, "bullet_tags": tags})

    def _curate(self, user: str, block: str, rng: random.Random) -> str:
        b = self.behaviour
        reflections = json_lines(block)
        bullets = _playbook_bullets(user)
        offered = offered_sections(user)
        known: dict[str, _Bullet] = {}
        for bullet in bullets:
            for k in bullet.keys:
                known.setdefault(k, bullet)
        known_text = {bl.content.strip() for bl in bullets}
        specific: dict[str, dict[str, Any]] = {}  # key -> {content, section, mentions, refs}
        generic: dict[str, str] = {}
        refs: dict[str, list[str]] = {}  # insight key or generic text -> refs of the reflections with it
        for r in reflections:
            for ins in r.get("insights") or []:
                if not isinstance(ins, dict):
                    continue
                content = str(ins.get("content", ""))
                section = as_offered(str(ins.get("section") or "verification"), offered)
                keys = insight_keys_in(content)
                if keys:
                    entry = specific.setdefault(keys[0], {"content": content, "section": section, "mentions": 0})
                    entry["mentions"] += 1
                    refs.setdefault(keys[0], []).append(str(r.get("ref", "")))
                elif content and content not in known_text:
                    generic.setdefault(content, section)
                    refs.setdefault(content, []).append(str(r.get("ref", "")))

        def cite(op: dict[str, Any], item: str) -> dict[str, Any]:
            # The reflections an operation comes from, as the prompt asks (when it lists refs).
            cited = [ref for ref in dict.fromkeys(refs.get(item, ())) if ref]
            return {**op, "from": cited} if cited else op

        capacity = b.consolidation_capacity(len(reflections), 1.0, rng)
        novel = [k for k in specific if k not in known]
        rng.shuffle(novel)
        novel.sort(key=lambda k: -specific[k]["mentions"])  # stable: ties stay in random order
        candidates = len(novel) + len(generic)
        ops: list[dict[str, Any]] = []
        generic_items = sorted(generic.items())
        rng.shuffle(generic_items)
        if candidates > capacity and generic_items and b.drifts_generic(len(reflections), rng.random()):
            text, section = generic_items.pop(0)  # overloaded: drifts to generic advice first
            ops.append(cite(_op("ADD", section, text), text))
        for k in novel:
            if len(ops) >= capacity:
                break
            ops.append(cite(_op("ADD", specific[k]["section"], specific[k]["content"]), k))
        for text, section in generic_items:
            if len(ops) >= capacity:
                break
            ops.append(cite(_op("ADD", section, text), text))
        for k in sorted(specific):
            if len(ops) >= capacity:
                break
            if k in known:
                draw = rng.random()
                if draw < b.near_dup_prob:
                    ops.append(cite(_op("ADD", specific[k]["section"], specific[k]["content"]), k))
                elif draw < b.near_dup_prob + b.update_prob:
                    ops.append(cite(_op("UPDATE", content=specific[k]["content"], bullet_id=known[k].id), k))
        return json.dumps({"operations": ops})

    def _merge(self, user: str, block: str, rng: random.Random) -> str:
        b = self.behaviour
        proposals = json_lines(block)
        bullets = _playbook_bullets(user)
        known_keys = {k for bl in bullets for k in bl.keys}
        bullet_ids = {bl.id for bl in bullets}
        capacity = b.consolidation_capacity(len(proposals), b.merge_capacity_factor, rng)
        by_key: dict[str, list[str]] = {}
        generic: list[str] = []
        edits: list[str] = []
        seen_text: set[str] = set()
        for p in proposals:
            pid, kind = str(p.get("id", "")), str(p.get("op", "")).upper()
            content = str(p.get("content") or "")
            if kind == "ADD":
                keys = insight_keys_in(content)
                if keys:
                    by_key.setdefault(keys[0], []).append(pid)
                elif content not in seen_text:
                    seen_text.add(content)
                    if rng.random() < b.merge_keep:
                        generic.append(pid)
            elif kind in ("UPDATE", "REMOVE") and p.get("bullet_id") in bullet_ids and rng.random() < b.merge_keep:
                edits.append(pid)
        novel: list[tuple[int, str]] = []  # (mentions, id)
        restated: list[str] = []
        for key, ids in by_key.items():
            keep_prob = b.merge_known_keep if key in known_keys else b.merge_keep
            if rng.random() < keep_prob:
                # Repeats of one insight are phrasings of the same rule: the prompt asks to keep the most
                # specific one by id (they are equally specific here, so the first) rather than restate it.
                if key in known_keys:
                    restated.append(ids[0])
                else:
                    novel.append((len(ids), ids[0]))
        # The same overload law as the curator's: within capacity, the most-repeated new insights first; an
        # overloaded call (more new candidates than it can write) first keeps one generic tip.
        rng.shuffle(novel)
        novel.sort(key=lambda item: -item[0])  # stable: ties stay in random order
        keep: list[str] = []
        if len(novel) + len(generic) > capacity and generic and b.drifts_generic(len(proposals), rng.random()):
            keep.append(generic.pop(0))
        for pid in [pid for _, pid in novel] + generic + edits + restated:
            if len(keep) >= capacity:
                break
            keep.append(pid)
        return json.dumps({"keep": keep, "combine": []})

    def _generate(self, system: str, task_block: str) -> str:
        b = self.behaviour
        try:
            task = json.loads(task_block)
        except json.JSONDecodeError:
            task = task_block
        task = task if isinstance(task, str) else json.dumps(task)
        keys = insight_keys_in(task)
        informed = bool(keys) and keys[0] in insight_keys_in(system)
        p = b.informed_accuracy if informed else b.base_accuracy
        truth = expected_answer(task)
        wrong = f"{(_h('wrong-answer', task) % 10_000_000) / 100:.2f}"
        answer = truth if _u(b.seed, "correct", task) < p else wrong
        return json.dumps({"reasoning": "Applied the rule the task names.", "final_answer": answer})


def retention(playbook_text: str, insights: Iterable[str]) -> float:
    """Share of ``insights`` (keys) present in ``playbook_text``; benchmark-side ground-truth scoring."""
    wanted = set(insights)
    if not wanted:
        return 0.0
    present = set(insight_keys_in(playbook_text))
    return len(wanted & present) / len(wanted)
