"""The combiner: the one writer of each namespace's playbook, below its stage (:mod:`workers.combine`).

From the top down: :mod:`~workers.combiner.bullets` (operators' actions on bullets), :mod:`~workers.combiner.commit`
(the commit point, claims and recovery), :mod:`~workers.combiner.pending` and :mod:`~workers.combiner.quarantine`
(the lessons held back, in Redis), :mod:`~workers.combiner.tenure` (a claim of a partition, and the registry of
them).
"""
