"""Reference plugin with the defaults of Debezium's Outbox Event Router, in Python: topic
``<topic_prefix><aggregate_type>``, key = aggregate id, payload unchanged, headers = the row's
headers plus ``id`` (outbox id) and ``event-type``, then the extra columns
``additional_placement`` places; timestamp = the row's ``created_at``.

Config: ``topic_prefix`` (default ``outbox.event.``), ``additional_placement`` (Debezium's
``table.fields.additional.placement``; default none). The port of
plugins/route-by-aggregate/src/lib.rs; tests/conformance checks the two give byte-identical
output.
"""

from sluice_plugin import (
    Config,
    OutboxRow,
    Placements,
    Plugin,
    TransformError,
    export,
    message,
    timestamp_of,
)

DEFAULT_TOPIC_PREFIX = "outbox.event."


class RouteByAggregate(Plugin):
    NAME = "route-by-aggregate"
    VERSION = "0.1.0"
    CONFIG_SCHEMA = (
        '{"type":"object","properties":{"topic_prefix":{"type":"string",'
        '"default":"outbox.event."},"additional_placement":{"type":"string","default":""}},'
        '"additionalProperties":false}'
    )

    def __init__(self, topic_prefix: str, placements: Placements):
        self.topic_prefix = topic_prefix
        self.placements = placements

    @classmethod
    def configure(cls, config: Config) -> "RouteByAggregate":
        config.allow_only(["topic_prefix", "additional_placement"])
        return cls(
            config.get_or("topic_prefix", DEFAULT_TOPIC_PREFIX),
            Placements.parse(config.get_or("additional_placement", "")),
        )

    def transform(self, row: OutboxRow):
        if not row.aggregate_type:
            raise TransformError.permanent(
                "empty-aggregate-type",
                "aggregate_type is empty, so there is no topic to route to",
            )
        msg = message(
            self.topic_prefix + row.aggregate_type,
            key=row.aggregate_id,
            payload=row.payload,
            headers=[*row.headers, ("id", row.id), ("event-type", row.event_type)],
            # Kafka's record timestamp: when the application wrote the row.
            timestamp_ms=timestamp_of(row),
        )
        # Extra columns ([database.columns] extra) as headers or the partition.
        return [self.placements.apply(row, msg)]


Transformer = export(RouteByAggregate)
