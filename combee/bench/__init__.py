"""``combee bench``: methods side by side on one SIMULATED trace set, timed against the simulator.

Everything this package measures comes from the Combee simulator (``docs/simulator.md``), and every file it
writes says so. Modules:

* :mod:`combee.bench.spec` — what to run: :class:`~combee.bench.spec.BenchConfig` and the run plan (pure);
* :mod:`combee.bench.worker` — one training run in a worker process, through the real OpenAI client;
* :mod:`combee.bench.run` — the orchestration: trace sets, simulator, phases, evaluation, files;
* :mod:`combee.bench.report` — medians, acceptance checks, the Markdown table (pure);
* :mod:`combee.bench.plots` — the PNG figures;
* :mod:`combee.cli.bench` (in the command line package, on top) — ``combee bench`` and ``python -m combee.bench``.
"""

from combee.bench.spec import BenchConfig, RunSpec, plan_runs

__all__ = ["BenchConfig", "RunSpec", "plan_runs"]
