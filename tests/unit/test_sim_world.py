"""The SIMULATED world model (combee.sim.world): answers depend on the items a call shows, and one overload law
governs every consolidating call — curator over reflections, merger over proposals (issue 12, items 1 and 6)."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from combee.models import AddOp, Delta, Playbook, Reflection, Trace
from combee.playbook import apply_delta
from combee.prompts import Proposal, curator_request, merger_request, reflector_request
from combee.sim.protocol import SimRequest
from combee.sim.world import Behaviour, WorldResponder, insight_content, insight_section


def _key(i: int) -> str:
    return f"FX-{i:04d}"


def _reflections(m: int) -> str:
    return "\n".join(
        json.dumps(
            {
                "ref": f"r{i + 1}",
                "insights": [{"section": insight_section(_key(i)), "content": insight_content(_key(i), 0)}],
            }
        )
        for i in range(m)
    )


def _proposals(m: int) -> str:
    return "\n".join(
        json.dumps(
            {
                "id": f"p{i + 1}",
                "op": "ADD",
                "section": insight_section(_key(i)),
                "content": insight_content(_key(i), 0),
            }
        )
        for i in range(m)
    )


def _request(user: str, *, system: str = "You curate.", model: str = "m", fmt: str = "ops") -> SimRequest:
    return SimRequest(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        response_format={"type": "json_schema", "json_schema": {"name": fmt, "schema": {"type": "object"}}},
    )


def _curator_user(m: int) -> str:
    return f"<playbook>\n(empty)\n</playbook>\n\n<reflections>\n{_reflections(m)}\n</reflections>"


def _merger_user(m: int) -> str:
    return f"<playbook>\n(empty)\n</playbook>\n\n<proposals>\n{_proposals(m)}\n</proposals>"


def _written(responder: WorldResponder, user: str, seed: int) -> int:
    answer = json.loads(responder.respond(_request(user), random.Random(seed)) or "{}")
    return len(answer.get("operations", answer.get("keep", [])))


def test_the_answer_depends_on_the_items_shown_not_on_who_sent_them() -> None:
    world = WorldResponder()
    for user in (_curator_user(12), _merger_user(12)):
        a = world.respond(_request(user), random.Random(7))
        b = world.respond(_request(user, system="Another method's wording.", model="other", fmt="x"), random.Random(7))
        assert a == b and a is not None


def test_the_capacity_law_passes_through_its_calibration_points_and_scales_with_the_factor() -> None:
    b = Behaviour()
    for m, k in b.capacity_points:
        assert b.capacity(m) == pytest.approx(k)
    assert b.capacity(7) == pytest.approx(
        math.exp(math.log(1.99) + (math.log(7 / 5) / math.log(2)) * math.log(2.42 / 1.99))
    )
    assert b.consolidation_capacity(40, None, random.Random(0)) == math.inf
    for factor in (1.0, 2.0, 4.0):
        draws = [b.consolidation_capacity(40, factor, random.Random(s)) for s in range(2000)]
        assert all(d == int(d) for d in draws)
        assert statistics.fmean(draws) == pytest.approx(factor * b.capacity(40), rel=0.03)


@pytest.mark.parametrize("m", [5, 20, 40, 100])
def test_a_merge_at_factor_one_overloads_exactly_like_a_curator_call(m: int) -> None:
    # With selection itself lossless (merge_keep 1), what remains is the shared capacity law.
    world = WorldResponder(Behaviour(merge_keep=1.0, merge_capacity_factor=1.0))
    curated = statistics.fmean(_written(world, _curator_user(m), s) for s in range(300))
    merged = statistics.fmean(_written(world, _merger_user(m), s) for s in range(300))
    assert curated == pytest.approx(merged, rel=0.08)
    assert merged == pytest.approx(min(m, Behaviour().capacity(m)), rel=0.08)


def test_the_merge_factor_scales_what_a_merge_keeps_and_none_is_unlimited() -> None:
    m = 40
    kept = {}
    for factor in (1.0, 2.0, 4.0, None):
        world = WorldResponder(Behaviour(merge_keep=1.0, merge_capacity_factor=factor))
        kept[factor] = statistics.fmean(_written(world, _merger_user(m), s) for s in range(300))
    k = Behaviour().capacity(m)
    assert kept[1.0] == pytest.approx(k, rel=0.08)
    assert kept[2.0] == pytest.approx(2 * k, rel=0.08)
    assert kept[4.0] == pytest.approx(4 * k, rel=0.08)
    assert kept[None] == m


def test_an_overloaded_merge_keeps_the_most_repeated_new_insights_first() -> None:
    # 30 proposals: insight 0 proposed 10 times, insights 1..20 once each; capacity(30) ≈ 4.
    lines = [
        json.dumps({"id": f"p{i}", "op": "ADD", "section": "formulas", "content": insight_content(_key(0), i % 5)})
        for i in range(10)
    ]
    lines += [
        json.dumps({"id": f"q{i}", "op": "ADD", "section": "formulas", "content": insight_content(_key(i), 0)})
        for i in range(1, 21)
    ]
    world = WorldResponder(Behaviour(merge_keep=1.0))
    user = "<playbook>\n(empty)\n</playbook>\n\n<proposals>\n" + "\n".join(lines) + "\n</proposals>"
    for seed in range(20):
        keep = json.loads(world.respond(_request(user), random.Random(seed)) or "{}")["keep"]
        assert keep[0] == "p0" and len(keep) <= 6


def test_the_answers_do_not_depend_on_how_the_playbook_lays_out_its_bullets() -> None:
    # The prompt lays bullets out for prefix caching (settled ones by section, newer ones after); the simulated
    # model reads the same bullets whatever their order, so a layout can make no role's answer easier.
    keys = [_key(i) for i in range(22)]  # next_id 23: ids 20-22 are listed after the settled ones
    ops = tuple(AddOp(section=insight_section(k), content=insight_content(k, 1)) for k in keys)
    pb = apply_delta(Playbook(namespace="ns"), Delta(namespace="ns", window_id="w", base_version=0, ops=ops))[0]
    trace = Trace(trace_id="t", namespace="ns", task=f"Apply rule {keys[20]}.", output="1")
    refl = [Reflection(trace_id="t", base_version=1, insights=())]
    props = [Proposal("p1", AddOp(section=insight_section(keys[3]), content=insight_content(keys[3], 2)))]
    world = WorldResponder()
    for request in (reflector_request(trace, pb), curator_request(refl, pb), merger_request(props, pb)):
        user = request.messages[1].content
        lines = user.split("\n")
        bullets = [i for i, line in enumerate(lines) if line.startswith("- [b")]
        shuffled = [lines[i] for i in bullets]
        random.Random(5).shuffle(shuffled)
        for i, line in zip(bullets, shuffled, strict=True):
            lines[i] = line
        assert lines != user.split("\n") and "Newer lessons" in user
        answers = {
            world.respond(_request(text, system=request.messages[0].content), random.Random(11))
            for text in (user, "\n".join(lines))
        }
        assert len(answers) == 1
