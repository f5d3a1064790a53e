"""Exercises the Python SDK through a real component: each row's event_type picks one
behaviour (see rows.jsonl). Run by tests/conformance/run: its output must equal
expected.jsonl, as the JavaScript probe's must."""

import random
import time

from sluice_plugin import (
    Config,
    OutboxRow,
    Plugin,
    RecordSchema,
    SchemaFormat,
    TransformError,
    counter_add,
    export,
    header,
    info,
    message,
)


PROBE_SCHEMA = '{"type":"record","name":"Probe","namespace":"com.acme","fields":[]}'


class SdkProbe(Plugin):
    NAME = "sdk-probe"
    VERSION = "0.1.0"
    SCHEMAS = [RecordSchema("com.acme.Probe", SchemaFormat.AVRO, PROBE_SCHEMA)]

    def __init__(self, suffix: str):
        self.suffix = suffix

    @classmethod
    def configure(cls, config: Config) -> "SdkProbe":
        config.allow_only(["suffix"])
        return cls(config.require("suffix"))

    def transform(self, row: OutboxRow):
        kind = row.event_type
        if kind == "fan-out":
            return [
                message("a" + self.suffix, key=row.aggregate_id, payload=row.payload),
                message("b" + self.suffix, key=b"\xff\x00", payload="ü", partition=1),
            ]
        if kind == "filter":
            return []
        if kind == "tombstone":
            return [message("t", key=row.aggregate_id)]
        if kind == "echo-header":
            value = header(row, "x")
            return [message("h", payload=b"missing" if value is None else value)]
        if kind == "retryable":
            raise TransformError.retryable("busy", "try again later")
        if kind == "permanent":
            raise TransformError.permanent("bad-row", "cannot route this")
        if kind == "crash":
            return [message({}["no such key"])]
        if kind == "text":
            return [message("text", payload=row.payload.decode("utf-8").upper())]
        if kind == "fields":
            fields = f"{row.id}|{row.tenant}|{row.attempt}|{row.created_at_ms}"
            return [message("f", payload=fields)]
        if kind == "host":
            info(f"row {row.id} says hello")
            print(f"row {row.id} prints")
            counter_add("probe.rows", 1)
            return []
        if kind == "sandbox":
            # Documents the sandbox: clocks frozen at 0 (1970), randomness available.
            in_range = "yes" if 0 <= random.random() < 1 else "no"
            return [message("s", payload=f"time={int(time.time())} random-in-range={in_range}")]
        if kind == "records":
            return [
                message(
                    "r",
                    payload=row.payload,
                    value_record="com.acme.Probe",
                    key_record="com.acme.Key",
                )
            ]
        raise TransformError.permanent("unknown-kind", kind)


Transformer = export(SdkProbe)
