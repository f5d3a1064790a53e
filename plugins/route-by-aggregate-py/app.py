"""Reference plugin with the defaults of Debezium's Outbox Event Router, in Python: topic
``<topic_prefix><aggregate_type>``, key = aggregate id, payload unchanged, headers = the row's
headers plus ``id`` (outbox id) and ``event-type``.

Config: ``topic_prefix`` (default ``outbox.event.``). The port of
plugins/route-by-aggregate/src/lib.rs; tests/conformance checks the two give byte-identical
output.
"""

from sluice_plugin import Config, OutboxRow, Plugin, TransformError, export, message

DEFAULT_TOPIC_PREFIX = "outbox.event."


class RouteByAggregate(Plugin):
    NAME = "route-by-aggregate"
    VERSION = "0.1.0"
    CONFIG_SCHEMA = (
        '{"type":"object","properties":{"topic_prefix":{"type":"string",'
        '"default":"outbox.event."}},"additionalProperties":false}'
    )

    def __init__(self, topic_prefix: str):
        self.topic_prefix = topic_prefix

    @classmethod
    def configure(cls, config: Config) -> "RouteByAggregate":
        config.allow_only(["topic_prefix"])
        return cls(config.get_or("topic_prefix", DEFAULT_TOPIC_PREFIX))

    def transform(self, row: OutboxRow):
        if not row.aggregate_type:
            raise TransformError.permanent(
                "empty-aggregate-type",
                "aggregate_type is empty, so there is no topic to route to",
            )
        return [
            message(
                self.topic_prefix + row.aggregate_type,
                key=row.aggregate_id,
                payload=row.payload,
                headers=[*row.headers, ("id", row.id), ("event-type", row.event_type)],
            )
        ]


Transformer = export(RouteByAggregate)
