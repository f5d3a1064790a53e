"""Guest SDK for Sluice plugins written in Python (``sluice:plugin@0.3.0``).

The Python counterpart of the Rust SDK in ``plugins/sdk``: subclass :class:`Plugin`, then bind
the export name componentize-py looks for::

    from sluice_plugin import Config, OutboxRow, Plugin, TransformError, export, message

    class ToOneTopic(Plugin):
        NAME = "to-one-topic"
        VERSION = "0.1.0"

        def __init__(self, topic: str):
            self.topic = topic

        @classmethod
        def configure(cls, config: Config) -> "ToOneTopic":
            config.allow_only(["topic"])
            return cls(config.require("topic"))

        def transform(self, row: OutboxRow):
            return [message(self.topic, key=row.aggregate_id, payload=row.payload)]

    Transformer = export(ToOneTopic)

Build with componentize-py 0.25.1 (see docs/plugin-languages.md)::

    componentize-py -d wit -w plugin componentize app -p . -o plugin.wasm

What the SDK takes care of, so plugin code need not know the runtime's rules:

- componentize-py creates a fresh ``Transformer`` object for every exported call, so state set
  on ``self`` in ``configure`` would be gone in ``transform``. The configured plugin object is
  kept here, at module level, where every call finds it.
- Every module this SDK needs is imported below, at module top level: the component has no
  file system at run time, so an ``import`` first reached inside a call traps. Plugin code must
  follow the same rule.
- ``transform-batch`` is implemented by calling ``transform`` per row.
- An exception other than :class:`TransformError` escaping ``transform`` would trap the
  instance with nothing but "wasm `unreachable` instruction executed" (the traceback goes to a
  stderr the host discards). The SDK turns it into a *retryable* error with code
  ``uncaught-exception`` whose message names the exception and where it was raised; the row is
  retried and then dead-lettered exactly as after a trap, but ``last_error`` says why.
- ``print()`` and anything written to ``sys.stdout`` / ``sys.stderr`` during a call go to
  Sluice's log (at info / warn level, one entry per line): the component's own stdout and
  stderr are discarded by the host.

``row.id`` is the outbox id as a ``str``, whatever the id column's type: ``"42"`` for an
integer id, a uuid's canonical lower-case text, a text id as the database returns it.
``row.extra`` lists the ``[database.columns] extra`` columns as ``ExtraColumn(name, value)``,
each value one of the ``ColumnValue_…`` classes (``ColumnValue_Text("eu")``,
``ColumnValue_Integer(5)``, ``ColumnValue_Null()``, …); :func:`extra` finds one by name.
"""

import decimal
import sys
import traceback
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Type, Union

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import (
    ColumnValue_Boolean,
    ColumnValue_Bytes,
    ColumnValue_Float,
    ColumnValue_Integer,
    ColumnValue_Json,
    ColumnValue_Null,
    ColumnValue_Text,
    ColumnValue_TimestampMs,
    ErrorDetail,
    ExtraColumn,
    LogLevel,
    OutboxRow,
    OutputMessage,
    PluginInfo,
    RecordSchema,
    SchemaFormat,
    TransformError_Permanent,
    TransformError_Retryable,
)

__all__ = [
    "ColumnValue_Boolean",
    "ColumnValue_Bytes",
    "ColumnValue_Float",
    "ColumnValue_Integer",
    "ColumnValue_Json",
    "ColumnValue_Null",
    "ColumnValue_Text",
    "ColumnValue_TimestampMs",
    "Config",
    "ExtraColumn",
    "Placements",
    "extra",
    "header_value",
    "timestamp_of",
    "RecordSchema",
    "SchemaFormat",
    "ConfigError",
    "LogLevel",
    "Message",
    "OutboxRow",
    "Plugin",
    "TransformError",
    "counter_add",
    "debug",
    "error",
    "export",
    "header",
    "info",
    "log",
    "message",
    "warn",
]

#: The message type plugins return (``output-message`` of the WIT). Build one with
#: :func:`message`.
Message = OutputMessage

Bytes = Union[bytes, bytearray, memoryview, str]


def _as_bytes(value: Bytes) -> bytes:
    """Text is sent as UTF-8; anything bytes-like as its bytes."""
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def _quote(text: str) -> str:
    """Quotes ``text`` the way the Rust SDK's messages do (Rust's ``{:?}``), so the same
    mistake reads the same in every language."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\0":
            out.append("\\0")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def message(
    topic: str,
    *,
    key: Optional[Bytes] = None,
    payload: Optional[Bytes] = None,
    headers: Iterable[Tuple[str, Bytes]] = (),
    partition: Optional[int] = None,
    value_record: Optional[str] = None,
    key_record: Optional[str] = None,
    timestamp_ms: Optional[int] = None,
) -> Message:
    """A message to ``topic``. ``key``/``payload`` ``None`` mean no key / a tombstone; text is
    sent as UTF-8. ``partition`` ``None`` leaves the choice to Kafka's partitioner (by key).
    ``value_record``/``key_record``: with ``value_format``/``key_format`` set for the tenant,
    the Avro record or Protobuf message (full name) to encode as, in place of the section's.
    ``timestamp_ms``: the record's timestamp in milliseconds since the epoch (Kafka's record
    timestamp; ``None``: the producer's time); :func:`timestamp_of` gives the row's."""
    return OutputMessage(
        topic=topic,
        key=None if key is None else _as_bytes(key),
        payload=None if payload is None else _as_bytes(payload),
        headers=[(name, _as_bytes(value)) for name, value in headers],
        partition=partition,
        value_record=value_record,
        key_record=key_record,
        timestamp_ms=timestamp_ms,
    )


def timestamp_of(row: OutboxRow) -> Optional[int]:
    """The row's ``created_at`` as a message timestamp, as the reference plugins and the
    builtin router use it (``None`` for a time before the epoch, which Kafka refuses)."""
    return row.created_at_ms if row.created_at_ms >= 0 else None


def extra(row: OutboxRow, name: str):
    """The value of the row's extra column called ``name`` (a ``ColumnValue_…``), or
    ``None`` when the row does not carry it."""
    for column in row.extra:
        if column.name == name:
            return column.value
    return None


def _float_text(f: float) -> str:
    """Rust's ``f64`` Display: the shortest digits that read back, no exponent, no ``.0``."""
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    text = format(decimal.Decimal(repr(f)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def header_value(value) -> Optional[bytes]:
    """An extra column's value as a header carries it, as the builtin router writes it:
    text and JSON as UTF-8, integers and floats in decimal, booleans ``true``/``false``,
    timestamps as milliseconds since the epoch in decimal, bytes as they are; ``None`` for
    NULL."""
    if isinstance(value, ColumnValue_Null):
        return None
    if isinstance(value, (ColumnValue_Text, ColumnValue_Json)):
        return value.value.encode("utf-8")
    if isinstance(value, (ColumnValue_Integer, ColumnValue_TimestampMs)):
        return str(value.value).encode("utf-8")
    if isinstance(value, ColumnValue_Float):
        return _float_text(value.value).encode("utf-8")
    if isinstance(value, ColumnValue_Boolean):
        return b"true" if value.value else b"false"
    if isinstance(value, ColumnValue_Bytes):
        return bytes(value.value)
    raise TypeError(f"not a column value: {value!r}")


class Placements:
    """``additional_placement``, as the host's builtin router reads it (Debezium's
    ``table.fields.additional.placement``): ``column:header[:alias]`` and
    ``column:partition``, comma-separated; same output and errors as the builtin and the Rust
    SDK."""

    def __init__(self, placements):
        self.placements = placements

    @classmethod
    def parse(cls, spec: str) -> "Placements":
        """Raises :class:`ConfigError` when the list is malformed or asks for
        ``envelope``."""
        placements = []
        for raw in spec.split(","):
            entry = raw.strip()
            if not entry:
                continue
            parts = [p.strip() for p in entry.split(":")]
            if len(parts) == 2 and parts[1] == "header":
                target = ("header", parts[0])
            elif len(parts) == 3 and parts[1] == "header" and parts[2]:
                target = ("header", parts[2])
            elif len(parts) == 2 and parts[1] == "partition":
                target = ("partition", None)
            elif len(parts) >= 2 and parts[1] == "envelope":
                raise ConfigError(
                    f"additional_placement {_quote(entry)}: envelope is not supported (the "
                    "payload is published unchanged); use header or partition"
                )
            else:
                raise ConfigError(
                    f"additional_placement {_quote(entry)}: expected column:header[:alias] or "
                    "column:partition"
                )
            if not parts[0]:
                raise ConfigError(f"additional_placement {_quote(entry)}: the column is empty")
            placements.append((parts[0], target))
        return cls(placements)

    def apply(self, row: OutboxRow, msg: Message) -> Message:
        """``msg`` with the row's placed extra columns: headers appended in list order (none
        for NULL), the partition set from an integer column. Raises a permanent
        :class:`TransformError` for a column the row lacks, or a partition that is not an
        integer from 0 to 2^31-1."""
        for column, (kind, name) in self.placements:
            value = extra(row, column)
            if value is None:
                raise TransformError.permanent(
                    "missing-extra-column",
                    f"additional_placement names column {column}, which the row does not "
                    "carry (list it in [database.columns] extra)",
                )
            if kind == "header":
                data = header_value(value)
                if data is not None:
                    msg.headers.append((name, data))
            elif not isinstance(value, ColumnValue_Null):
                if not (
                    isinstance(value, ColumnValue_Integer) and 0 <= value.value <= 2147483647
                ):
                    raise TransformError.permanent(
                        "invalid-partition",
                        f"column {column} is placed as the partition but does not hold an "
                        "integer from 0 to 2147483647",
                    )
                msg.partition = value.value
        return msg


def header(row: OutboxRow, name: str) -> Optional[bytes]:
    """The value of the row's first header called ``name``, or ``None``."""
    for key, value in row.headers:
        if key == name:
            return value
    return None


class TransformError(Exception):
    """Raise from ``transform`` to fail a row: nothing of it is published.

    ``TransformError.retryable(...)``: the host retries the row with back-off, then
    dead-letters it. ``TransformError.permanent(...)``: dead-lettered at once.
    """

    def __init__(self, retryable: bool, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.is_retryable = retryable
        self.code = code
        self.message = message

    @classmethod
    def retryable(cls, code: str, message: str) -> "TransformError":
        return cls(True, code, message)

    @classmethod
    def permanent(cls, code: str, message: str) -> "TransformError":
        return cls(False, code, message)

    def to_wit(self):
        detail = ErrorDetail(code=self.code, message=self.message)
        if self.is_retryable:
            return TransformError_Retryable(detail)
        return TransformError_Permanent(detail)


class ConfigError(ValueError):
    """A bad ``config`` table; its text becomes ``configure``'s error, with which
    ``sluice run`` quarantines the tenant (its rows wait; with ``strict_startup`` it refuses
    to start)."""


class Config:
    """The tenant's ``config`` table from sluice.toml, as string pairs."""

    def __init__(self, pairs: Sequence[Tuple[str, str]]):
        self.pairs = list(pairs)

    def get(self, key: str) -> Optional[str]:
        for k, v in self.pairs:
            if k == key:
                return v
        return None

    def get_or(self, key: str, default: str) -> str:
        value = self.get(key)
        return default if value is None else value

    def require(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"missing required config key {_quote(key)}")
        return value

    def allow_only(self, known: Sequence[str]) -> None:
        """Refuses keys other than ``known``, so a typo in sluice.toml is reported, not
        ignored."""
        for k, _ in self.pairs:
            if k not in known:
                raise ConfigError(
                    f"unknown config key {_quote(k)} (known keys: {', '.join(known)})"
                )


class Plugin:
    """What a plugin implements. One object is made per tenant instance by
    :meth:`configure` and used for every row of that tenant."""

    NAME: str = "unnamed"
    VERSION: str = "0.0.0"
    #: JSON Schema of the accepted config, shown by ``sluice plugin check``.
    CONFIG_SCHEMA: Optional[str] = None
    #: Schemas of the records the plugin emits, e.g.
    #: ``[RecordSchema("com.acme.OrderCreated", SchemaFormat.AVRO, AVSC_TEXT)]``: a tenant with
    #: ``auto_register = true`` and no schema file registers them in its Schema Registry.
    SCHEMAS: List[RecordSchema] = []

    @classmethod
    def configure(cls, config: Config) -> "Plugin":
        """Builds the plugin from the tenant's config. Raise :class:`ConfigError` (or any
        exception) to refuse it: ``sluice run`` then quarantines the tenant with the message
        (its rows wait, starting is retried; with ``strict_startup`` it refuses to start)."""
        config.allow_only([])
        return cls()

    def transform(self, row: OutboxRow) -> List[Message]:
        """Zero messages drop the row, several fan it out. Raise :class:`TransformError` to
        fail it."""
        raise NotImplementedError

    def transform_batch(
        self, rows: List[OutboxRow]
    ) -> List[Union[List[Message], TransformError]]:
        """One entry per row, in order: its messages, or the error that failed it. Defaults
        to :meth:`transform` per row."""
        return [_row_result(self.transform, row) for row in rows]


def log(level: LogLevel, text: str) -> None:
    """Logs through the host's log, tagged with the tenant; cut at 1 KiB, rate-limited."""
    host.log(level, text)


def debug(text: str) -> None:
    host.log(LogLevel.DEBUG, text)


def info(text: str) -> None:
    host.log(LogLevel.INFO, text)


def warn(text: str) -> None:
    host.log(LogLevel.WARN, text)


def error(text: str) -> None:
    host.log(LogLevel.ERROR, text)


def counter_add(name: str, delta: int) -> None:
    """Adds ``delta`` to a host-side counter called ``name``."""
    host.counter_add(name, delta)


class _HostLogWriter:
    """A text stream that sends each complete line to the host's log."""

    def __init__(self, level: LogLevel):
        self.level = level
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            host.log(self.level, line)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            host.log(self.level, self.pending)
            self.pending = ""

    def isatty(self) -> bool:
        return False


def _send_output_to_host_log() -> None:
    """Done on the first exported call, not at import: at build time (componentize-py runs
    the module's top level then) the host is not there, and a call to it fails the build."""
    if not isinstance(sys.stdout, _HostLogWriter):
        sys.stdout = _HostLogWriter(LogLevel.INFO)
        sys.stderr = _HostLogWriter(LogLevel.WARN)


def _describe(exc: BaseException) -> str:
    """``KeyError: 'x' (at app.py:12 in transform)``: enough to find the bug."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return text


def _uncaught(exc: BaseException) -> TransformError:
    return TransformError.retryable("uncaught-exception", _describe(exc))


def _row_result(
    transform: Callable[[OutboxRow], List[Message]], row: OutboxRow
) -> Union[List[Message], TransformError]:
    try:
        return list(transform(row))
    except TransformError as e:
        return e
    except Exception as e:  # noqa: BLE001 - see the module docs: a readable error, not a trap
        return _uncaught(e)


def _not_configured() -> TransformError:
    return TransformError.permanent("not-configured", "configure was not called")


class _State:
    """The configured plugin of this instance, kept at module level (see the module docs)."""

    def __init__(self, plugin_class: Type[Plugin]):
        self.plugin_class = plugin_class
        self.plugin: Optional[Plugin] = None


def export(plugin_class: Type[Plugin]) -> type:
    """The class componentize-py exports as ``sluice:plugin/transformer``: assign it to a
    module-level name ``Transformer`` in the app module."""
    state = _State(plugin_class)

    class Transformer(exports.Transformer):
        def info(self) -> PluginInfo:
            _send_output_to_host_log()
            return PluginInfo(
                name=plugin_class.NAME,
                version=plugin_class.VERSION,
                config_schema=plugin_class.CONFIG_SCHEMA,
                schemas=list(plugin_class.SCHEMAS),
            )

        def configure(self, config: List[Tuple[str, str]]) -> None:
            _send_output_to_host_log()
            try:
                state.plugin = plugin_class.configure(Config(config))
            except Exception as e:  # noqa: BLE001 - the text is configure's error
                raise Err(str(e) if isinstance(e, ConfigError) else _describe(e))

        def transform(self, row: OutboxRow) -> List[Message]:
            _send_output_to_host_log()
            plugin = state.plugin
            result = (
                _not_configured() if plugin is None else _row_result(plugin.transform, row)
            )
            if isinstance(result, TransformError):
                raise Err(result.to_wit())
            return result

        def transform_batch(self, rows: List[OutboxRow]):
            _send_output_to_host_log()
            plugin = state.plugin
            if plugin is None:
                return [Err(_not_configured().to_wit()) for _ in rows]
            try:
                results = plugin.transform_batch(rows)
            except Exception as e:  # noqa: BLE001 - fails each row readably instead of trapping
                failure = e if isinstance(e, TransformError) else _uncaught(e)
                return [Err(failure.to_wit()) for _ in rows]
            return [
                Err(r.to_wit()) if isinstance(r, TransformError) else Ok(list(r))
                for r in results
            ]

    return Transformer
