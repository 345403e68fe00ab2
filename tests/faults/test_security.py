"""Issue #5, part 4: the pipeline against a Redis that requires credentials, and no secret in any output.

The suite's private Redis requires a password (``requirepass``); here the workers authenticate as a Redis ACL
USER limited to the run's key prefix and channels. Then every secret a deployment has — the Redis password,
the ACL user's password, the LLM API key, a Kafka SASL password, and a wrong password somebody typed — is
grepped for in everything Combee wrote: worker logs (including their error paths: Redis unreachable with the
password in the URL, an LLM endpoint that echoes the key it rejects, Kafka SASL against a broker that does
not speak it, contradictory settings), the status/metrics JSON the workers keep in Redis, ``combee status``
and ``combee prompt`` output and error messages, and the dead-letter topic.
"""

from __future__ import annotations

import http.server
import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from combee.models import Playbook
from combee.playbook import render_prompt
from tests.faults.harness import REPO, PacedPublisher, Producer, PromptWatcher, Run, TopicTail, wait_until
from tests.faults.invariants import Figures, check, observe
from tests.faults.stack import PrivateStack, free_port
from tests.faults.suite import Settler, figure_lines, good_traces

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]


class Collected:
    """Every text Combee produced in this module, with where it came from."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.secrets: dict[str, str] = {}

    def add(self, where: str, text: str | bytes) -> None:
        self.texts.append((where, text.decode("utf-8", "replace") if isinstance(text, bytes) else text))

    def secret(self, name: str, value: str) -> str:
        self.secrets[name] = value
        return value


def _combee(run: Run, *args: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "combee.cli", *args],
        env=run.env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


class _KeyEchoingEndpoint(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that rejects every key — and echoes it back, as careless servers do."""

    def do_POST(self) -> None:
        key = self.headers.get("Authorization", "").removeprefix("Bearer ")
        body = json.dumps({"error": {"message": f"Incorrect API key provided: {key}", "type": "invalid_api_key"}})
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def do_GET(self) -> None:
        self.do_POST()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def collected(stack: PrivateStack, workdir: Path, api_key: str) -> Iterator[tuple[Collected, Figures, Run]]:
    out = Collected()
    out.secret("LLM API key", api_key)
    out.secret("Redis password (requirepass)", stack.redis_password)
    user = f"combee-{secrets.token_hex(4)}"
    acl_password = out.secret("Redis ACL user password", "acl-" + secrets.token_urlsafe(20))
    wrong = out.secret("a wrong Redis password", "wrong-" + secrets.token_urlsafe(20))
    sasl = out.secret("Kafka SASL password", "sasl-" + secrets.token_urlsafe(20))
    run = Run(
        stack,
        workdir / "security",
        "security",
        api_key=api_key,
        env_extra={"COMBEE_REDIS_USERNAME": user, "COMBEE_REDIS_PASSWORD": acl_password},
    )
    admin = run.redis()
    admin.execute_command(
        "ACL", "SETUSER", user, "reset", "on", f">{acl_password}", f"~{run.prefix}:*", "resetchannels",
        f"&{run.prefix}:*", "+@all", "-@dangerous", "+client|setname", "+client|setinfo",
    )  # fmt: skip
    figures = Figures(scenario="redis-acl")
    try:
        # 1. the pipeline, authenticated as the ACL user ------------------------------------------------
        run.start_sim()
        run.ensure_topics()
        run.start_worker("learner")
        run.start_worker("curate")
        good, truths = good_traces(30)
        watcher_ns = list(truths)
        watcher = PromptWatcher(run, watcher_ns)
        watcher.start()
        producer = run.producer()
        publisher = PacedPublisher(producer, good, 30.0)
        publisher.start()
        publisher.join_checked()
        producer.close()
        settler = Settler(run)
        settler.wait(producer.sent, 300)
        settler.close()
        time.sleep(2.5)  # one more status report from the learner
        obs = observe(run, watcher_ns, watcher)
        check(run, producer.sent, obs, figures)
        for ns in watcher_ns:
            status = admin.get(run.keys.status(ns))
            assert status, f"no worker status for {ns}"
            out.add(f"worker status (metrics) of {ns} in Redis", status)
        # the CLI as the ACL user: status (with lag) and prompts
        status = _combee(run, "status", "--json", "--prefix", run.prefix)
        assert status.returncode == 0, status.stderr
        out.add("combee status --json", status.stdout + status.stderr)
        rows = {r["namespace"]: r for r in json.loads(status.stdout)["namespaces"]}
        for ns in watcher_ns:
            got = _combee(run, "prompt", "get", ns, "--json", "--prefix", run.prefix)
            assert got.returncode == 0, got.stderr
            out.add(f"combee prompt get {ns}", got.stdout + got.stderr)
            prompt = json.loads(got.stdout)
            assert prompt["version"] == rows[ns]["version"] == obs.redis_current[ns] > 0
            playbook = Playbook.model_validate_json(obs.redis_versions[ns][prompt["version"]][1])
            assert prompt["prompt"] == render_prompt(playbook)
        # 2. error paths --------------------------------------------------------------------------------
        ns = watcher_ns[0]
        for args in (("prompt", "get", ns), ("status", "--json")):
            bad = _combee(run, *args, "--prefix", run.prefix, COMBEE_REDIS_PASSWORD=wrong)
            assert bad.returncode != 0 or "error" in (bad.stdout + bad.stderr).lower(), bad
            out.add(f"combee {' '.join(args)} with a wrong password", bad.stdout + bad.stderr)
        contradictory = _combee(run, "worker", "--role", "learner", COMBEE_KAFKA_SASL_PASSWORD=sasl)
        assert contradictory.returncode != 0
        out.add("combee worker: SASL password with PLAINTEXT", contradictory.stdout + contradictory.stderr)
        try:
            sasl_run = _combee(
                run, "worker", "--role", "learner", timeout_s=120,
                COMBEE_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", COMBEE_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
                COMBEE_KAFKA_SASL_USERNAME="combee", COMBEE_KAFKA_SASL_PASSWORD=sasl,
                COMBEE_KAFKA_STARTUP_TIMEOUT_S="5",  # the handshake never succeeds: 5 s, not the default 30 s
            )  # fmt: skip
            out.add("combee worker: SASL against a PLAINTEXT broker", sasl_run.stdout + sasl_run.stderr)
        except subprocess.TimeoutExpired as exc:
            out.add(
                "combee worker: SASL against a PLAINTEXT broker (timed out)", (exc.stdout or b"") + (exc.stderr or b"")
            )
        # a worker whose Redis URL carries the password, while that Redis is unreachable
        closed = free_port()
        url_worker = run.start_worker(
            "all",
            COMBEE_REDIS_URL=f"redis://{urllib.parse.quote(user)}:{urllib.parse.quote(acl_password)}@127.0.0.1:{closed}/0",
            COMBEE_REDIS_USERNAME="",
            COMBEE_REDIS_PASSWORD="",
            COMBEE_TOPIC_PREFIX=run.prefix + "-url",
            COMBEE_KEY_PREFIX=run.prefix + "-url",
        )
        url_producer = Producer(stack.bootstrap, f"{run.prefix}-url.traces")
        wait_until(lambda: url_worker.joined() or not url_worker.alive(), 90, "the URL worker to start", poll_s=0.5)
        for record in good[:10]:
            url_producer.send(record)
        url_producer.close()
        wait_until(
            lambda: "publish of" in url_worker.log.read_text(errors="replace") or not url_worker.alive(),
            120,
            "a failed publish to the unreachable Redis",
        )
        url_worker.stop()
        # a worker whose LLM endpoint rejects the key and echoes it back
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyEchoingEndpoint)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            echo_worker = run.start_worker(
                "all",
                OPENAI_BASE_URL=f"http://127.0.0.1:{server.server_port}/v1",
                COMBEE_TOPIC_PREFIX=run.prefix + "-echo",
                COMBEE_KEY_PREFIX=run.prefix,  # the ACL user may write under run.prefix only
            )
            echo_producer = Producer(stack.bootstrap, f"{run.prefix}-echo.traces")
            wait_until(lambda: echo_worker.joined() or not echo_worker.alive(), 90, "the echo worker", poll_s=0.5)
            for record in good[:5]:
                echo_producer.send(record)
            echo_producer.close()
            wait_until(
                lambda: (
                    echo_worker.log.read_text(errors="replace").count("rejected the API key") >= 2
                    or not echo_worker.alive()
                ),
                120,
                "the endpoint to reject the key twice",
            )
            echo_worker.stop()
        finally:
            server.shutdown()
        for topic in (run.topics.deadletter, f"{run.prefix}-echo.deadletter", f"{run.prefix}-url.deadletter"):
            tail = TopicTail(stack.bootstrap, topic)
            for r in tail.poll():
                out.add(f"dead letter in {topic}", r.value or b"")
            tail.close()
    finally:
        run.close()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
    for w in run.workers:
        out.add(f"log of worker {w.name}", w.log.read_bytes() if w.log.exists() else b"")
    yield out, figures, run


def test_the_pipeline_runs_against_redis_as_an_acl_user_with_a_password(
    collected: tuple[Collected, Figures, Run],
) -> None:
    _, figures, _ = collected
    print()
    for line in figure_lines(figures)[:5]:
        print(line)
    assert figures.published == figures.learned > 0 and figures.versions_published > 0
    assert not figures.violations, figures.violations


def test_no_secret_appears_in_logs_metrics_or_error_messages(collected: tuple[Collected, Figures, Run]) -> None:
    out, _, _ = collected
    texts = out.texts
    assert sum(len(t) for _, t in texts) > 10_000, "too little output collected to mean anything"
    joined = "\n".join(t for _, t in texts)
    # the error paths did happen (so their messages were checked)
    assert "publish of" in joined and "rejected the API key" in joined
    leaks = []
    for name, value in out.secrets.items():
        for form in {value, urllib.parse.quote(value), urllib.parse.quote(value, safe="")}:
            for where, text in texts:
                if form in text:
                    leaks.append(f"{name} found in {where}")
    print(
        f"\nchecked {len(texts)} outputs ({sum(len(t) for _, t in texts):,} characters) for {len(out.secrets)} secrets"
    )
    assert not leaks, "\n".join(sorted(set(leaks)))
