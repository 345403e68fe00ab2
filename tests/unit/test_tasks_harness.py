"""The finance harness end to end: scripted model through run_harness, and the CLI against the simulator."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from combee.cli import main
from combee.cli.task import display_url
from combee.embeddings import NearDuplicates
from combee.engine import Method, MethodConfig
from combee.learner import LearnConfig
from combee.llm import LLM, ChatRequest, ChatResponse, Role
from combee.tasks.data import Question, default_data_dir
from combee.tasks.report import document, markdown, write_plot
from combee.tasks.report import main as report_main
from combee.tasks.run import (
    BASELINE,
    HarnessConfig,
    HarnessResult,
    PhaseStats,
    Resumed,
    StepTiming,
    run_harness,
    with_timing,
)
from tests.fakes import GroupEmbedder, ScriptedLLM, block_lines, echo_script

QUESTIONS = [Question(f"q:{i}", f"Question {i}: what is {i} + {i}? Answer:", f"{2 * i}.0") for i in range(1, 9)]


def _reply(answer: str) -> str:
    return json.dumps({"reasoning": "adding", "final_answer": answer})


def _script(request: ChatRequest) -> str:
    if request.role is not Role.GENERATOR:
        return echo_script(request)
    system = request.messages[0].content
    user = request.messages[-1].content
    i = int(user.split("Question ")[1].split(":")[0])
    # right on odd questions; with any lesson in the playbook, right on every question
    return _reply(f"{2 * i}" if i % 2 or "lesson:" in system else "0")


async def test_every_method_learns_the_same_traces_and_every_playbook_sees_the_same_test_questions() -> None:
    llms: dict[str, ScriptedLLM] = {}

    @contextlib.asynccontextmanager
    async def llm_for(phase: str) -> AsyncIterator[LLM]:
        llms[phase] = ScriptedLLM(_script)
        yield llms[phase]

    methods = {
        "sequential": LearnConfig(MethodConfig(method=Method.SEQUENTIAL), batch_size=1),
        "naive": LearnConfig(MethodConfig(method=Method.NAIVE), batch_size=4),
        "combee": LearnConfig(MethodConfig(method=Method.COMBEE), batch_size=4),
    }
    config = HarnessConfig(task="formula", train=QUESTIONS[:4], test=QUESTIONS[4:], methods=methods, concurrency=2)
    ticks = iter(range(10_000))
    result = await run_harness(config, llm_for, clock=lambda: float(next(ticks)))

    assert sorted(llms) == ["eval", "learn-combee", "learn-naive", "learn-sequential", "traces"]
    # the agent answered with the empty playbook; 2 of the 4 training answers were right
    assert [a.grade.success for a in result.train_attempts] == [True, False, True, False]
    assert [t.task for t in result.traces] == [q.context for q in QUESTIONS[:4]]
    for method in methods:
        reflected = [block_lines(r, "trace")[0] for r in llms[f"learn-{method}"].requests if r.role is Role.REFLECTOR]
        assert [t["task"] for t in reflected] == [q.context for q in QUESTIONS[:4]]
        assert [t["feedback"]["success"] for t in reflected] == [True, False, True, False]
    assert list(result.evals) == [BASELINE, "sequential", "naive", "combee"]
    assert all([a.question.id for a in v] == [q.id for q in QUESTIONS[4:]] for v in result.evals.values())
    assert result.learned["naive"].batch_sizes == [4]
    assert result.learned["sequential"].batch_sizes == [1, 1, 1, 1]

    doc = document(result, {"task": "formula", "simulated": False, "model": "m", "endpoint": "e", "seed": 0,
                             "batch_size": 4}, resamples=200)  # fmt: skip
    rows = {m["method"]: m for m in doc["methods"]}
    assert rows[BASELINE]["accuracy"] == 0.5 and rows[BASELINE]["learn"] is None
    assert rows["combee"]["accuracy"] == 1.0 and rows["combee"]["delta_vs_none"]["mean"] == 0.5
    assert rows["combee"]["learn"]["calls"] == rows["combee"]["learn"]["calls_by_role"]["reflector"] + sum(
        n for role, n in rows["combee"]["learn"]["calls_by_role"].items() if role != "reflector"
    )
    lo, hi = rows[BASELINE]["ci95"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0
    assert rows["sequential"]["eval"]["calls"] == 4
    assert doc["combee_vs_sequential_learning"]["ratio"] > 0
    assert doc["traces"]["success_rate"] == 0.5
    text = markdown(doc)
    assert "| combee |" in text and "real model" in text


async def test_the_learners_fold_near_duplicates_with_the_configured_de_duplicator() -> None:
    # the workers and `combee learn` de-duplicate semantically; the harness must measure that configuration
    def reworded(request: ChatRequest) -> str:
        if request.role is not Role.REFLECTOR:
            return _script(request)
        i = int(block_lines(request, "trace")[0]["task"].split("Question ")[1].split(":")[0])
        lesson = "lesson: add the two numbers" + (" together" if i % 2 else "")  # one lesson, two wordings
        return json.dumps({"diagnosis": "ok", "insights": [{"section": "lessons", "content": lesson}],
                           "bullet_tags": []})  # fmt: skip

    @contextlib.asynccontextmanager
    async def llm_for(phase: str) -> AsyncIterator[LLM]:
        yield ScriptedLLM(reworded)

    embedder = GroupEmbedder([["add the two numbers"]])  # the two wordings share a vector
    methods = {"sequential": LearnConfig(MethodConfig(method=Method.SEQUENTIAL), batch_size=1)}
    config = HarnessConfig(task="formula", train=QUESTIONS[:4], test=QUESTIONS[4:6], methods=methods,
                           dedup=NearDuplicates(embedder))  # fmt: skip
    result = await run_harness(config, llm_for)
    meter = result.learned["sequential"].meter
    assert embedder.texts > 0 and meter.folded_ops + meter.folded_proposals > 0
    assert len(result.playbooks["sequential"].bullets) == 1
    plain = await run_harness(replace(config, dedup=None), llm_for)
    assert len(plain.playbooks["sequential"].bullets) == 2  # without it, exact matching keeps both wordings
    doc = document(result, {"task": "formula", "simulated": False, "model": "m", "endpoint": "e", "seed": 0,
                            "batch_size": 1}, resamples=50)  # fmt: skip
    row = next(m for m in doc["methods"] if m["method"] == "sequential")
    assert row["learn"]["dedup"]["folded_ops"] + row["learn"]["dedup"]["folded_proposals"] > 0


def _fixture_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("formula_train_subset_500.jsonl", "formula_test.jsonl"):
        rows = [{"context": f"Use formula Sum. Question: \"{i} + {i}?\". Answer:", "target": f"{2 * i}.0"}
                for i in range(1, 4)]  # fmt: skip
        (data / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


@pytest.mark.timeout(120)
def test_the_cli_runs_end_to_end_against_the_simulator_and_a_rerun_comes_from_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["task", "formula", "--sim", "--n-train", "3", "--n-test", "3", "--out", str(out),
            "--data-dir", str(_fixture_data(tmp_path)), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "SIMULATED" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["simulated"] is True and doc["model"] == "combee-sim"
    assert [m["method"] for m in doc["methods"]] == ["none", "sequential", "naive", "combee"]
    assert all(m["eval"]["calls"] == 3 for m in doc["methods"])
    assert doc["traces"]["calls"] == 3 and doc["batch_size"] == 3
    for name in ("results.md", "traces.jsonl", "playbooks/combee.json", "answers/none.jsonl", "accuracy.png"):
        assert (out / name).exists(), name
    assert len((out / "traces.jsonl").read_text().splitlines()) == 3
    assert doc["cached_calls"] == sum(m["eval"]["cached_calls"] for m in doc["methods"])  # fresh cache

    journal = json.loads((out / "timings.json").read_text())
    fresh = {"traces", *(f"learn-{m['method']}" for m in doc["methods"] if m["learn"])}
    fresh |= {f"eval-{m['method']}" for m in doc["methods"] if not m["eval"]["cached_calls"]}
    assert set(journal) == fresh  # every phase the model answered, none the cache did

    assert main(argv) == 0  # the same run again: every answer from the cache, reported with the first timings
    again = json.loads((out / "results.json").read_text())
    assert set(again["timed_in_earlier_runs"]) == fresh
    assert again["traces"]["wall_s"] == doc["traces"]["wall_s"] and again["traces"]["cached_calls"] == 0
    for first, second in zip(doc["methods"], again["methods"], strict=True):
        if first["learn"]:
            assert second["learn"]["wall_s"] == first["learn"]["wall_s"]
            assert second["learn"]["timed_in_an_earlier_run_at"] == journal[f"learn-{first['method']}"]["measured_at"]
    assert [m["accuracy"] for m in again["methods"]] == [m["accuracy"] for m in doc["methods"]]
    assert again["simulated"] is True
    assert "Timed in an earlier run of this command" in (out / "results.md").read_text()

    # without the journal the replay is what it is: every answer from the cache
    (out / "timings.json").unlink()
    assert main(argv) == 0
    bare = json.loads((out / "results.json").read_text())
    assert bare["timed_in_earlier_runs"] == {}
    assert bare["cached_calls"] == bare["traces"]["calls"] + sum(
        m["eval"]["calls"] + (m["learn"]["calls"] if m["learn"] else 0) for m in bare["methods"]
    )
    # and its table says so instead of printing the cache's clock as a wall time
    rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| sequential |")]
    assert rows[0].count("| replayed |") == 2  # the accuracy table's row: learning and evaluation
    assert "Trace collection: 3 generator calls, replayed, " in (out / "results.md").read_text()

    # a phase answered partly from the cache: its wall time is shown with how much of it the cache answered
    bare["methods"][1]["eval"] |= {"wall_s": 42.0, "cached_calls": 1}
    assert "| 42.0 (1 of 3 cached) |" in markdown(bare)

    # results.md and the plot rendered again from results.json alone
    (out / "results.json").write_text(json.dumps(bare))
    (out / "results.md").unlink()
    (out / "accuracy.png").unlink()
    assert report_main([str(out)]) == 0
    assert (out / "results.md").read_text() == markdown(bare) and (out / "accuracy.png").exists()
    assert report_main([str(tmp_path / "nowhere")]) == 1 and report_main([]) == 2


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["task", "formula", "--sim", "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "data file not found" in err and "github.com/ace-agent/ace" in err and err.count("\n") == 1
    code = main(["task", "formula", "--sim", "--n-train", "9", "--out", str(tmp_path / "o"),
                 "--data-dir", str(_fixture_data(tmp_path)), "--quiet"])  # fmt: skip
    assert code == 2
    assert "holds 3" in capsys.readouterr().err


def test_the_real_model_demo_says_where_to_get_missing_data_before_it_starts_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COMBEE_FINANCE_DATA", str(tmp_path))
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never reached: the data is checked first
    assert main(["demo", "--llm", "endpoint", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "data file not found" in err and "github.com/ace-agent/ace" in err and err.count("\n") == 1


def test_unreachable_endpoint_fails_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["task", "formula", "--base-url", "http://127.0.0.1:9/v1", "--n-train", "2", "--n-test", "2",
                 "--out", str(tmp_path / "o"), "--data-dir", str(_fixture_data(tmp_path)), "--quiet"])  # fmt: skip
    assert code == 3
    assert "cannot reach the model" in capsys.readouterr().err


def test_endpoint_display_hides_credentials_and_query() -> None:
    shown = display_url("https://user:s3cret@example.com:8443/v1?api_key=abc#x")
    assert "s3cret" not in shown and "abc" not in shown
    assert shown.startswith("https://") and shown.endswith("example.com:8443/v1")


def test_data_dir_default_and_override() -> None:
    assert default_data_dir({"COMBEE_FINANCE_DATA": "/data/x"}) == Path("/data/x")
    assert default_data_dir({}).parts[-5:] == ("shared", "data", "ace-agent-ace", "finance", "data")


async def test_the_metering_wrapper_passes_the_context_window_through() -> None:
    from combee.tasks.run import MeteredLLM, PhaseStats

    class Sized(ScriptedLLM):
        async def context_tokens(self, role: Role) -> int | None:
            return 4096

    assert await MeteredLLM(Sized(_script), PhaseStats()).context_tokens(Role.REFLECTOR) == 4096
    assert await MeteredLLM(ScriptedLLM(_script), PhaseStats()).context_tokens(Role.REFLECTOR) is None


async def test_a_method_whose_calls_cannot_fit_the_context_is_reported_failed_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    def script(request: ChatRequest) -> str:
        if request.role is Role.REFLECTOR:
            lesson = "When the task names a formula, substitute every given value before computing. " * 6
            return json.dumps({"diagnosis": "d", "insights": [{"section": "formulas", "content": lesson[:590]}]})
        return _script(request)

    class Small(ScriptedLLM):
        async def context_tokens(self, role: Role) -> int | None:
            return 3000

    @contextlib.asynccontextmanager
    async def llm_for(phase: str) -> AsyncIterator[LLM]:
        yield Small(script)

    questions = [Question(f"q:{i}", f"Question {i}: what is {i} + {i}? Answer:", f"{2 * i}.0") for i in range(1, 13)]
    methods = {
        "sequential": LearnConfig(MethodConfig(method=Method.SEQUENTIAL), batch_size=1),
        "naive": LearnConfig(MethodConfig(method=Method.NAIVE), batch_size=12),
    }
    config = HarnessConfig(task="formula", train=questions, test=questions[:2], methods=methods)
    result = await run_harness(config, llm_for)
    assert list(result.failed) == ["naive"] and "context" in result.failed["naive"]
    assert list(result.evals) == [BASELINE, "sequential"]
    assert result.context_tokens == 3000
    doc = document(result, {"task": "formula", "simulated": False, "model": "m", "endpoint": "e", "seed": 0,
                             "batch_size": 12}, resamples=50)  # fmt: skip
    assert [m["method"] for m in doc["methods"]] == [BASELINE, "sequential", "naive"]
    assert "failed:" in markdown(doc)
    assert write_plot(doc, tmp_path / "a.png").exists()


def test_a_replayed_phase_reports_the_timing_of_the_run_that_filled_the_cache() -> None:
    earlier = PhaseStats(wall_s=120.0, calls=4, cached=0, prompt_tokens=400, completion_tokens=80)
    replay = PhaseStats(wall_s=0.02, calls=4, cached=4, prompt_tokens=400, completion_tokens=80)
    got = with_timing(replay, earlier, "2026-12-01T17:00:00Z")
    assert (got.wall_s, got.cached, got.timed_at) == (120.0, 0, "2026-12-01T17:00:00Z")
    assert PhaseStats.from_dict(got.as_dict()) == got
    assert with_timing(replay, None, "t") is replay  # nothing recorded
    partly = PhaseStats(wall_s=30.0, calls=4, cached=2)
    assert with_timing(partly, earlier, "t") is partly  # half the answers are the model's: its own timing
    assert with_timing(replay, PhaseStats(wall_s=1.0, calls=4, cached=1), "t") is replay  # not a model timing
    assert with_timing(replay, PhaseStats(wall_s=1.0, calls=5), "t") is replay  # other calls: another phase


class _Stop(Exception):
    """Stands for the operator stopping a long run part-way."""


class _Cached:
    """A scripted model behind a response cache shared across runs: a request answered before comes back
    marked cached, as :class:`combee.llm_openai.ResponseCache` marks its hits."""

    def __init__(self, seen: dict[str, ChatResponse]) -> None:
        self.seen = seen
        self.inner = ScriptedLLM(_script)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        key = request.model_dump_json()
        if key in self.seen:
            return self.seen[key].model_copy(update={"cached": True})
        response = await self.inner.complete(request)
        self.seen[key] = response
        return response


async def _harness(
    seen: dict[str, ChatResponse],
    *,
    steps: dict[str, StepTiming] | None = None,
    on_step: Callable[[str, int, PhaseStats], None] | None = None,
) -> HarnessResult:
    @contextlib.asynccontextmanager
    async def llm_for(phase: str) -> AsyncIterator[LLM]:
        yield _Cached(seen)

    methods = {"sequential": LearnConfig(MethodConfig(method=Method.SEQUENTIAL), batch_size=1)}
    config = HarnessConfig(task="formula", train=QUESTIONS[:4], test=QUESTIONS[4:5], methods=methods)
    ticks = iter(range(0, 1_000_000, 10))
    return await run_harness(config, llm_for, clock=lambda: float(next(ticks)), steps=steps, on_step=on_step)


async def _learn_sequential(
    seen: dict[str, ChatResponse], *, steps: dict[str, StepTiming] | None = None, stop_at: int | None = None
) -> tuple[dict[int, PhaseStats], PhaseStats | None]:
    recorded: dict[int, PhaseStats] = {}

    def on_step(name: str, step: int, stats: PhaseStats) -> None:
        recorded[step] = stats.copy()
        if step == stop_at:
            raise _Stop

    try:
        result = await _harness(seen, steps=steps, on_step=on_step)
    except _Stop:
        return recorded, None
    return recorded, result.phases["learn-sequential"]


async def test_a_learning_phase_stopped_part_way_resumes_with_the_timing_of_its_first_steps() -> None:
    seen: dict[str, ChatResponse] = {}
    first, _ = await _learn_sequential(seen, stop_at=2)  # stopped after the second trace
    assert sorted(first) == [1, 2] and first[2].cached == 0 and first[2].calls > first[1].calls
    earlier = StepTiming(2, first[2], "2026-12-01T18:00:00Z")

    steps, got = await _learn_sequential(seen, steps={"learn-sequential": earlier})
    assert got is not None and steps[2].resumed_after == 2
    fresh_after = steps[4].calls - steps[2].calls
    # the first two traces: the earlier run's time; the last two: this run's; no answer counted as cached
    assert got.resumed_after == 2 and got.timed_at == "2026-12-01T18:00:00Z"
    assert got.cached == 0 and got.calls == first[2].calls + fresh_after
    # this run's clock ticks 10 per reading; its time after step 2 is added to the earlier 2 steps' time
    assert first[2].wall_s < got.wall_s < first[2].wall_s + got.calls * 100
    assert PhaseStats.from_dict(got.as_dict()).resumed_after == 2


async def test_the_report_says_which_phase_was_resumed_and_where() -> None:
    seen: dict[str, ChatResponse] = {}
    first, _ = await _learn_sequential(seen, stop_at=3)
    result = await _harness(seen, steps={"learn-sequential": StepTiming(3, first[3], "2026-12-01T18:00:00Z")})
    doc = document(result, {"task": "formula", "simulated": False, "model": "m", "endpoint": "e", "seed": 0,
                             "batch_size": 1}, resamples=20)  # fmt: skip
    assert doc["resumed_phases"] == {
        "learn-sequential": {"after_step": 3, "first_steps_timed_at": "2026-12-01T18:00:00Z"}
    }
    assert "learn-sequential" not in doc["timed_in_earlier_runs"]
    assert "learn-sequential was resumed: its first 3 steps" in markdown(doc)


async def test_a_resume_that_does_not_replay_exactly_the_earlier_calls_is_timed_afresh() -> None:
    seen: dict[str, ChatResponse] = {}
    first, _ = await _learn_sequential(seen, stop_at=2)
    for wrong in (
        StepTiming(2, PhaseStats(wall_s=99.0, calls=first[2].calls + 1), "t"),  # other calls: not that run
        StepTiming(2, PhaseStats(wall_s=99.0, calls=first[2].calls, cached=1), "t"),  # itself partly a replay
        StepTiming(3, first[2], "t"),  # that step was not answered from the cache
    ):
        _, got = await _learn_sequential(dict(seen), steps={"learn-sequential": wrong})
        assert got is not None and got.resumed_after is None and got.timed_at is None
        assert got.cached == first[2].calls  # the replayed answers count as cached


def test_resumed_figures_are_the_earlier_steps_plus_what_followed() -> None:
    earlier = StepTiming(2, PhaseStats(wall_s=3000.0, calls=4), "t0")
    resumed = Resumed(earlier)
    mark = PhaseStats(wall_s=0.5, calls=4, cached=4, prompt_tokens=40)
    assert resumed.at(1, PhaseStats(wall_s=0.2, calls=2, cached=2)).resumed_after is None  # not there yet
    assert resumed.at(2, mark).wall_s == 3000.0
    end = resumed.figures(PhaseStats(wall_s=100.5, calls=6, cached=4, prompt_tokens=60))
    assert (end.wall_s, end.calls, end.cached, end.prompt_tokens, end.timed_at) == (3100.0, 6, 0, 60, "t0")


def test_a_replayed_phase_keeps_the_critical_path_of_the_run_that_filled_the_cache() -> None:
    # a cached answer takes no time, so the critical path of a replayed reduce must come from the journal
    earlier = PhaseStats(wall_s=700.0, calls=8, cached=0, critical_path_s=690.5)
    replay = PhaseStats(wall_s=0.1, calls=8, cached=8, critical_path_s=0.0)
    got = with_timing(replay, earlier, "2026-12-02T22:00:00Z")
    assert got.critical_path_s == 690.5
    assert PhaseStats.from_dict(got.as_dict()).critical_path_s == 690.5
    assert "critical_path_s" not in PhaseStats(wall_s=1.0).as_dict()  # a phase that measures none says none


@pytest.mark.timeout(180)
def test_an_overload_run_can_reduce_the_reflections_an_earlier_run_recorded_without_reflecting_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(_fixture_data(tmp_path))
    first, second = tmp_path / "first", tmp_path / "second"
    base = ["task", "formula", "--sim", "--overload", "--n-train", "3", "--n-test", "3", "--data-dir", data, "--quiet"]
    assert main([*base, "--out", str(first), "--skip", "sequential"]) == 0
    # the simulator finds nothing to teach in the fixture's sums: give each recorded reflection a lesson of its own
    rows = [json.loads(line) for line in (first / "reflections.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        row["reflection"]["insights"] = [{"section": "formulas", "content": f"Lesson {i}: add both terms."}]
    (first / "reflections.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main([*base, "--out", str(second), "--reflections-from", str(first), "--skip", "naive-b3"]) == 0
    capsys.readouterr()

    earlier = json.loads((first / "overload.json").read_text())
    doc = json.loads((second / "overload.json").read_text())
    assert doc["recorded_in"] == str(first) and "recorded_in" not in earlier
    assert doc["traces"] == earlier["traces"] and doc["reflections"] == earlier["reflections"]
    assert set(json.loads((second / "timings.json").read_text())) == {f"reduce-{v['variant']}" for v in doc["variants"]}
    for name in ("traces.jsonl", "reflections.jsonl"):
        assert (second / name).read_text() == (first / name).read_text()
    assert [v["variant"] for v in doc["variants"]][-1] == "sequential" and all(v["calls"] for v in doc["variants"])
    assert "recorded in" in (second / "overload.md").read_text()


def test_recorded_reflections_of_other_questions_or_an_incomplete_folder_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(_fixture_data(tmp_path))
    recorded = tmp_path / "recorded"
    base = ["task", "formula", "--sim", "--overload", "--n-test", "3", "--data-dir", data, "--quiet"]
    assert main([*base, "--n-train", "2", "--out", str(recorded), "--skip", "sequential"]) == 0
    capsys.readouterr()

    assert main([*base, "--n-train", "3", "--out", str(tmp_path / "o"), "--reflections-from", str(recorded)]) == 2
    err = capsys.readouterr().err
    assert "holds the traces of 2 training questions, not this run's 3" in err and err.count("\n") == 1

    traces = recorded / "traces.jsonl"
    kept = traces.read_text()
    traces.write_text(kept + "{not json\n")
    assert main([*base, "--n-train", "2", "--out", str(tmp_path / "o"), "--reflections-from", str(recorded)]) == 2
    err = capsys.readouterr().err
    assert "traces.jsonl: line 3:" in err and err.count("\n") == 1
    traces.write_text(kept)

    (recorded / "reflections.jsonl").unlink()
    assert main([*base, "--n-train", "2", "--out", str(tmp_path / "o"), "--reflections-from", str(recorded)]) == 2
    assert "missing" in capsys.readouterr().err

    argv = ["task", "formula", "--sim", "--data-dir", data, "--out", str(tmp_path / "o"), "--quiet"]
    assert main([*argv, "--reflections-from", str(recorded)]) == 2
    assert "--reflections-from is an option of --overload" in capsys.readouterr().err
