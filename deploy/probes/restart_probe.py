"""Fault probe: a Faust worker and a kafka-python producer keep working across a broker restart.

A worker counts words (see faust_probe.py) while 100 records are produced; then the broker is restarted with
deploy.local.restart_kafka (graceful, then again with SIGKILL, i.e. a crash), 100 more records are produced
after each restart, and the worker must count every record. Kafka delivers at least once, so a crash may make
the worker count a few records twice: the probe reports such duplicates rather than failing on them.

Needs the state dir of the running stack (exported by `deploy.local exec` as COMBEE_STATE_DIR):

    python -m deploy.local exec -- .venv/bin/python deploy/probes/restart_probe.py
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from deploy import local
from deploy.probes import Checks
from deploy.probes.faust_probe import WORDS, WorkerProcess, remove_datadir


def main() -> int:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    bootstrap = os.environ["COMBEE_KAFKA_BOOTSTRAP"]
    state_dir = Path(os.environ["COMBEE_STATE_DIR"])
    checks = Checks("restart")
    app_id = f"probe-restart-{uuid.uuid4().hex[:8]}"
    topic = f"{app_id}.words"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=20, reconnect_backoff_max_ms=2000)
    expected: Counter[str] = Counter()

    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            word = WORDS[sent % len(WORDS)]
            producer.send(topic, key=word.encode(), value=str(sent).encode())  # unique values
            expected[word] += 1
            sent += 1
        producer.flush(timeout=60)

    worker = WorkerProcess(app_id, bootstrap, 300, distinct=True)
    produce(100)
    time.sleep(8)  # let the worker start, join and count the first batch
    for kill in (False, True):
        how = "SIGKILL (crash)" if kill else "SIGTERM (graceful)"
        with checks.step(f"broker restart by {how}, then 100 more records are accepted"):
            started = time.monotonic()
            local.restart_kafka(state_dir, kill=kill)
            print(f"  restart_kafka(kill={kill}) returned after {time.monotonic() - started:.1f} s")
            started = time.monotonic()
            produce(100)
            print(f"  producer delivered 100 records {time.monotonic() - started:.1f} s after the restart")
    with checks.step("the worker counted every record across both restarts"):
        counts, elapsed = worker.wait(180)
        missing = {w: expected[w] - counts.get(w, 0) for w in expected if counts.get(w, 0) < expected[w]}
        duplicates = sum(counts.values()) - sum(expected.values())
        print(f"  worker finished after {elapsed:.1f} s: {counts}; duplicates counted: {duplicates}")
        assert not missing, f"missing: {missing}"
    producer.close()
    remove_datadir(app_id)
    return checks.report()


if __name__ == "__main__":
    sys.exit(main())
