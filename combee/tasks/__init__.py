"""The paper's finance tasks (Formula, FiNER) with a real or simulated model: data, grading, traces, harness.

``combee task formula|finer`` (:mod:`combee.cli.task`) collects training traces with the empty playbook,
learns them offline with sequential, naive and Combee, and evaluates every playbook on held-out questions.
"""
