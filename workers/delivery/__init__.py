"""The delivery layer: what Faust and aiokafka do not do the way the stages need, answered once.

Each module names the library behaviour it answers. Nothing here knows a stage, an envelope or the method:
the stages above take events from :func:`~workers.delivery.backfill.with_backfill`, ack them through
:class:`~workers.delivery.acks.OrderedAcks`, and keep their state in
:class:`~workers.delivery.tables.ChangelogTable` over :class:`~workers.delivery.kafka_io.KafkaIO`.
"""
