"""{{name}}: a Sluice plugin. As it comes, it does what the builtin ``route-by-aggregate`` does
(the defaults of Debezium's Outbox Event Router): each outbox row goes to
``<topic_prefix><aggregate_type>`` (prefix default ``outbox.event.``), keyed by the aggregate
id, with the payload unchanged and the row's headers plus ``id`` (the outbox id) and
``event-type``, then the extra columns ``additional_placement`` places (Debezium's
``table.fields.additional.placement``), and the row's ``created_at`` as the record timestamp.
A row without an aggregate type is dead-lettered.

Change ``transform`` to route your rows; keep rows.jsonl/expected.jsonl in step (see
README.md). Import every module here, at the top: an import first reached inside a call
traps (the plugin has no file system at run time).
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


class Router(Plugin):
    NAME = "{{name}}"
    VERSION = "0.1.0"

    def __init__(self, topic_prefix: str, placements: Placements):
        self.topic_prefix = topic_prefix
        self.placements = placements

    @classmethod
    def configure(cls, config: Config) -> "Router":
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
            # Consumers of Debezium's router de-duplicate on ``id``; keep it when you
            # change the routing (the host adds the unforgeable ``sluice-outbox-id`` too).
            headers=[*row.headers, ("id", row.id), ("event-type", row.event_type)],
            # Kafka's record timestamp: when the application wrote the row.
            timestamp_ms=timestamp_of(row),
        )
        # Extra columns ([database.columns] extra) as headers or the partition.
        return [self.placements.apply(row, msg)]


# componentize-py looks for this name; the SDK keeps the configured Router for every call.
Transformer = export(Router)
