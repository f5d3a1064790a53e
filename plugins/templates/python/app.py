"""{{name}}: a Sluice plugin. As it comes, it does what the builtin ``route-by-aggregate`` does
(the defaults of Debezium's Outbox Event Router): each outbox row goes to
``<topic_prefix><aggregate_type>`` (prefix default ``outbox.event.``), keyed by the aggregate
id, with the payload unchanged and the row's headers plus ``id`` (the outbox id) and
``event-type``. A row without an aggregate type is dead-lettered.

Change ``transform`` to route your rows; keep rows.jsonl/expected.jsonl in step (see
README.md). Import every module here, at the top: an import first reached inside a call
traps (the plugin has no file system at run time).
"""

from sluice_plugin import Config, OutboxRow, Plugin, TransformError, export, message

DEFAULT_TOPIC_PREFIX = "outbox.event."


class Router(Plugin):
    NAME = "{{name}}"
    VERSION = "0.1.0"

    def __init__(self, topic_prefix: str):
        self.topic_prefix = topic_prefix

    @classmethod
    def configure(cls, config: Config) -> "Router":
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
                # Consumers of Debezium's router de-duplicate on ``id``; keep it when you
                # change the routing (the host adds the unforgeable ``sluice-outbox-id`` too).
                headers=[*row.headers, ("id", row.id), ("event-type", row.event_type)],
            )
        ]


# componentize-py looks for this name; the SDK keeps the configured Router for every call.
Transformer = export(Router)
