import pytest
from hypothesis import given
from hypothesis import strategies as st

from combee.errors import ContextTooSmall
from combee.models import Bullet, Playbook, Provenance, Trace
from combee.prompts import curator_ask, generator_ask, reflector_ask
from combee.sizing import MARGIN_TOKENS, completion_budget, line_tokens, prompt_tokens, select_bullets

PROV = Provenance(window_id="w", version=0)


def bullet(i: int, helpful: int = 0, harmful: int = 0, words: int = 20, section: str = "s") -> Bullet:
    content = f"Lesson {i}: " + " ".join(["word"] * words)
    return Bullet(
        id=f"b{i:05d}", section=section, content=content, helpful=helpful, harmful=harmful, created=PROV, updated=PROV
    )


def test_estimates_err_high() -> None:
    assert line_tokens("") == 1 and line_tokens("x" * 31) == 10
    assert prompt_tokens(["x" * 320]) == 8 + 8 + 100


def test_completion_budget() -> None:
    assert completion_budget(None, 10**6, 500, minimum=100) == 500  # unknown context: unsized
    assert completion_budget(4096, 1000, 500, minimum=100) == 500
    assert completion_budget(4096, 3800, 500, minimum=100) == 4096 - 3800 - MARGIN_TOKENS
    with pytest.raises(ContextTooSmall, match="4096 tokens of context") as info:
        completion_budget(4096, 4000, 500, minimum=100)
    assert (info.value.context_tokens, info.value.prompt_tokens, info.value.completion_tokens) == (4096, 4000, 100)


def test_select_bullets_prefers_the_best_record_and_keeps_id_order() -> None:
    bullets = [bullet(1, 0, 2), bullet(2, 5), bullet(3, 1), bullet(4, 5, 1)]
    one = line_tokens(f"- [b00001] {bullets[0].content}")
    heading = line_tokens("## s") + 1
    assert [b.id for b in select_bullets(bullets, heading + 2 * one)] == ["b00002", "b00004"]
    assert select_bullets(bullets, 10**6) == tuple(bullets)
    assert select_bullets(bullets, 0) == ()


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(1, 80)), max_size=30), st.integers(0, 3000))
def test_selected_bullets_fit_their_room(spec: list[tuple[int, int, int]], room: int) -> None:
    bullets = [bullet(i + 1, h, x, w, section=f"s{i % 3}") for i, (h, x, w) in enumerate(spec)]
    chosen = select_bullets(bullets, room)
    cost = sum(line_tokens(f"- [{b.id}] {b.content}") for b in chosen)
    cost += sum(line_tokens(f"## {s}") + 1 for s in {b.section for b in chosen})
    assert cost <= room
    assert list(chosen) == [b for b in bullets if b in chosen]  # in the given (id) order


BIG = Playbook(namespace="ns", version=9, bullets=tuple(bullet(i, helpful=i % 7) for i in range(1, 301)), next_id=301)
TRACE = Trace(trace_id="t", namespace="ns", task="Compute the current ratio.", output="2")


@pytest.mark.parametrize("context", [4096, 8192])
def test_a_large_playbook_is_cut_to_the_context_and_says_so(context: int) -> None:
    ask = reflector_ask(TRACE, BIG, context_tokens=context)
    request = ask.request
    assert prompt_tokens(m.content for m in request.messages) + request.max_tokens + MARGIN_TOKENS <= context
    user = request.messages[1].content
    shown = [line for line in user.splitlines() if line.startswith("- [b")]
    assert 0 < len(shown) < 300 and f"Only {len(shown)} of the playbook's 300 bullets are shown" in user
    ids = request.json_schema["properties"]["bullet_tags"]["items"]["properties"]["bullet_id"]["enum"]  # type: ignore[index]
    assert sorted(ids) == sorted(line[3:9] for line in shown)
    assert min(b.score for b in BIG.bullets if b.id in ids) >= max(b.score for b in BIG.bullets if b.id not in ids) - 1
    assert request.max_tokens >= 512


def test_no_context_means_the_whole_playbook_and_the_wanted_tokens() -> None:
    request = curator_ask([], BIG).request
    assert request.messages[1].content.count("- [b") == 300 and request.max_tokens == 4000


def test_a_context_too_small_for_anything_raises_with_the_numbers() -> None:
    with pytest.raises(ContextTooSmall, match="does not fit the model's context"):
        reflector_ask(TRACE.model_copy(update={"task": "x" * 8000}), BIG, context_tokens=1024)


def test_the_generator_prefix_is_the_same_for_every_short_task() -> None:
    a = generator_ask("What is 2+2?", BIG, context_tokens=4096).request
    b = generator_ask("Compute the NPV of 3 cash flows of $9,000 at 5%." * 5, BIG, context_tokens=4096).request
    assert a.messages[0].content == b.messages[0].content
    assert a.messages[0].content.startswith("# Playbook\n") and "(Playbook version 9.)" in a.messages[0].content
