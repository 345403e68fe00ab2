"""The combiner: the incremental scan merge and the one writer of each namespace's playbook.

Below its stage (:mod:`workers.combine`), from the top down: :mod:`~workers.combiner.scan` (open windows, merge
calls as soon as their inputs are present); :mod:`~workers.combiner.apply` (a finished window, next in
sequence); :mod:`~workers.combiner.rollback`, :mod:`~workers.combiner.promotion` and
:mod:`~workers.combiner.bullets` (operators' actions); :mod:`~workers.combiner.claim` (the start of a tenure:
claim, recover, replay); :mod:`~workers.combiner.commit` (the commit point: the deltas log, the snapshot table,
the checkpoint, the offer to Redis); :mod:`~workers.combiner.pending` and :mod:`~workers.combiner.quarantine`
(the lessons held back, in Redis). Its state is the registry of its claims, :class:`workers.tenure.Tenures`,
one per process (below the stages' shared context, which holds it). Every file reaches the worker through one
port, :class:`~workers.combiner.port.CombinerPort`: what the combiner uses of Kafka, Redis, the LLM and the
worker's tables, and nothing of the other stages.
"""
