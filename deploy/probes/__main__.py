"""Run every compatibility probe in turn against COMBEE_KAFKA_BOOTSTRAP; exit 1 if any check failed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

PROBES = ("kafka_python_probe.py", "aiokafka_probe.py", "faust_probe.py", "restart_probe.py")


def main() -> int:
    failed = 0
    for probe in PROBES:
        started = time.monotonic()
        code = subprocess.call([sys.executable, str(Path(__file__).with_name(probe))])
        print(f"== {probe}: exit {code} in {time.monotonic() - started:.1f} s", flush=True)
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
