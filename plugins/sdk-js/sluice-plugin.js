// Guest SDK for Sluice plugins written in JavaScript (`sluice:plugin@0.3.0`).
//
// The JavaScript counterpart of the Rust SDK in plugins/sdk: extend `Plugin`, then export the
// interface object componentize-qjs looks for:
//
//   import { Config, Message, Plugin, TransformError, exportPlugin } from "./sluice-plugin.js";
//
//   class ToOneTopic extends Plugin {
//     static NAME = "to-one-topic";
//     static VERSION = "0.1.0";
//     constructor(topic) { super(); this.topic = topic; }
//     static configure(config) {
//       config.allowOnly(["topic"]);
//       return new ToOneTopic(config.require("topic"));
//     }
//     transform(row) {
//       return [Message.to(this.topic).key(row.aggregateId).payload(row.payload)];
//     }
//   }
//
//   export const transformer = exportPlugin(ToOneTopic);
//
// Build with componentize-qjs 0.4.5 (QuickJS, see docs/plugin-languages.md):
//
//   componentize-qjs --wit wit --world plugin --sync --js plugin.js -o plugin.wasm
//
// What the SDK takes care of:
// - the configured plugin object is kept in this module, so every exported call sees it;
// - `transform-batch` is implemented by calling `transform` per row;
// - strings given as keys, payloads or header values are sent as UTF-8 (QuickJS has no
//   TextEncoder, so the SDK carries its own encoder);
// - an exception other than TransformError escaping `transform` would trap the instance with
//   nothing but "wasm `unreachable` instruction executed"; the SDK turns it into a retryable
//   error with code `uncaught-exception` naming the exception and where it was thrown;
// - `console.log/info/debug/warn/error` write to Sluice's log (QuickJS has no console at all,
//   and a guest's own stdout/stderr are discarded).
//
// WIT values as this runtime sees them: records are objects with camelCase fields
// (`row.aggregateId`, `row.createdAtMs`), `list<u8>` is a Uint8Array, headers are arrays of
// `[name, Uint8Array]`, `option` is the value or null. `row.id` is the outbox id as a string
// ("42" for an integer id, a uuid's canonical text, a text id as stored). `row.extra` is an
// array of `{name, value}`, each value a variant `{tag, val}` (`tag` "null", "text",
// "integer", "float", "boolean", "timestamp-ms", "json" or "bytes").

import * as host from "sluice:plugin/host@0.3.0";

// ---- bytes ------------------------------------------------------------------------------

/** UTF-8 bytes of `text`; a lone surrogate becomes U+FFFD, as TextEncoder does. */
export function utf8Encode(text) {
  const out = [];
  for (let i = 0; i < text.length; i++) {
    let cp = text.charCodeAt(i);
    if (cp >= 0xd800 && cp <= 0xdbff) {
      const next = i + 1 < text.length ? text.charCodeAt(i + 1) : 0;
      if (next >= 0xdc00 && next <= 0xdfff) {
        cp = 0x10000 + ((cp - 0xd800) << 10) + (next - 0xdc00);
        i++;
      } else {
        cp = 0xfffd;
      }
    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
      cp = 0xfffd;
    }
    if (cp < 0x80) {
      out.push(cp);
    } else if (cp < 0x800) {
      out.push(0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out.push(0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
    } else {
      out.push(
        0xf0 | (cp >> 18),
        0x80 | ((cp >> 12) & 0x3f),
        0x80 | ((cp >> 6) & 0x3f),
        0x80 | (cp & 0x3f),
      );
    }
  }
  return new Uint8Array(out);
}

/** Text of UTF-8 `bytes`; invalid sequences become U+FFFD. */
export function utf8Decode(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i];
    let cp = 0xfffd;
    let len = 1;
    if (b < 0x80) {
      cp = b;
    } else if (b >= 0xc2 && b <= 0xf4) {
      len = b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
      let value = b & (0xff >> (len + 1));
      let ok = i + len <= bytes.length;
      for (let k = 1; ok && k < len; k++) {
        const c = bytes[i + k];
        ok = (c & 0xc0) === 0x80;
        value = (value << 6) | (c & 0x3f);
      }
      const min = [0, 0, 0x80, 0x800, 0x10000][len];
      if (ok && value >= min && value <= 0x10ffff && !(value >= 0xd800 && value <= 0xdfff)) {
        cp = value;
      } else {
        len = 1;
      }
    }
    text += String.fromCodePoint(cp);
    i += len;
  }
  return text;
}

/** Strings are sent as UTF-8, byte arrays as they are. */
export function toBytes(value) {
  if (typeof value === "string") {
    return utf8Encode(value);
  }
  if (value instanceof Uint8Array) {
    return value;
  }
  if (ArrayBuffer.isView(value)) {
    return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  }
  if (Array.isArray(value) || value instanceof ArrayBuffer) {
    return new Uint8Array(value);
  }
  throw new TypeError(`expected a string or bytes, got ${typeof value}`);
}

// Quotes `text` the way the Rust SDK's messages do (Rust's `{:?}`), so the same mistake reads
// the same in every language.
function quote(text) {
  let out = '"';
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (cp === 0) out += "\\0";
    else if (cp < 0x20 || cp === 0x7f) out += `\\u{${cp.toString(16)}}`;
    else out += ch;
  }
  return out + '"';
}

// ---- rows and messages --------------------------------------------------------------------

/** The value of the row's first header called `name` (a Uint8Array), or null. */
export function header(row, name) {
  for (const [key, value] of row.headers) {
    if (key === name) {
      return value;
    }
  }
  return null;
}

/** The value (`{tag, val}`) of the row's extra column called `name` (`[database.columns]
 * extra`), or null when the row does not carry it. */
export function extra(row, name) {
  for (const column of row.extra || []) {
    if (column.name === name) {
      return column.value;
    }
  }
  return null;
}

// Rust's `f64` Display: the shortest digits that read back, never an exponent, no ".0".
function floatText(f) {
  if (Number.isNaN(f)) return "NaN";
  if (f === Infinity) return "inf";
  if (f === -Infinity) return "-inf";
  if (f === 0) return Object.is(f, -0) ? "-0" : "0";
  const text = String(f);
  const e = text.indexOf("e");
  if (e < 0) return text;
  const sign = text[0] === "-" ? "-" : "";
  const mantissa = text.slice(sign.length, e);
  const exponent = Number(text.slice(e + 1));
  const point = mantissa.indexOf(".");
  const digits = mantissa.replace(".", "");
  const intLen = (point < 0 ? mantissa.length : point) + exponent;
  if (intLen <= 0) return sign + "0." + "0".repeat(-intLen) + digits;
  if (intLen >= digits.length) return sign + digits + "0".repeat(intLen - digits.length);
  return sign + digits.slice(0, intLen) + "." + digits.slice(intLen);
}

/** An extra column's value as a header carries it, as the builtin router writes it: text and
 * JSON as UTF-8, integers and floats in decimal, booleans `true`/`false`, timestamps as
 * milliseconds since the epoch in decimal, bytes as they are; null for NULL. */
export function headerValue(value) {
  switch (value.tag) {
    case "null":
      return null;
    case "text":
    case "json":
      return utf8Encode(value.val);
    case "integer":
    case "timestamp-ms":
      return utf8Encode(String(value.val));
    case "float":
      return utf8Encode(floatText(value.val));
    case "boolean":
      return utf8Encode(value.val ? "true" : "false");
    case "bytes":
      return toBytes(value.val);
    default:
      throw new TypeError(`unknown column value ${quote(String(value.tag))}`);
  }
}

/** `additional_placement`, as the host's builtin router reads it (Debezium's
 * `table.fields.additional.placement`): `column:header[:alias]` and `column:partition`,
 * comma-separated; same output and errors as the builtin and the Rust SDK. */
export class Placements {
  /** Parses the list; throws ConfigError when it is malformed or asks for `envelope`. */
  static parse(spec) {
    const placements = [];
    for (const raw of String(spec).split(",")) {
      const entry = raw.trim();
      if (entry === "") continue;
      const parts = entry.split(":").map((p) => p.trim());
      let target;
      if (parts.length === 2 && parts[1] === "header") {
        target = { header: parts[0] };
      } else if (parts.length === 3 && parts[1] === "header" && parts[2] !== "") {
        target = { header: parts[2] };
      } else if (parts.length === 2 && parts[1] === "partition") {
        target = { partition: true };
      } else if (parts.length >= 2 && parts[1] === "envelope") {
        throw new ConfigError(
          `additional_placement ${quote(entry)}: envelope is not supported (the payload is published unchanged); use header or partition`,
        );
      } else {
        throw new ConfigError(
          `additional_placement ${quote(entry)}: expected column:header[:alias] or column:partition`,
        );
      }
      if (parts[0] === "") {
        throw new ConfigError(`additional_placement ${quote(entry)}: the column is empty`);
      }
      placements.push({ column: parts[0], target });
    }
    return new Placements(placements);
  }

  constructor(placements) {
    this.placements = placements;
  }

  /** `message` with the row's placed extra columns: headers appended in list order (none for
   * NULL), the partition set from an integer column. Throws a permanent TransformError for a
   * column the row lacks or a partition that is not an integer from 0 to 2^31-1. */
  apply(row, message) {
    for (const { column, target } of this.placements) {
      const value = extra(row, column);
      if (value === null) {
        throw TransformError.permanent(
          "missing-extra-column",
          `additional_placement names column ${column}, which the row does not carry (list it in [database.columns] extra)`,
        );
      }
      if (target.header !== undefined) {
        const bytes = headerValue(value);
        if (bytes !== null) message.header(target.header, bytes);
      } else if (value.tag !== "null") {
        const n = value.tag === "integer" ? Number(value.val) : -1;
        if (!(Number.isInteger(n) && n >= 0 && n <= 2147483647)) {
          throw TransformError.permanent(
            "invalid-partition",
            `column ${column} is placed as the partition but does not hold an integer from 0 to 2147483647`,
          );
        }
        message.partition(n);
      }
    }
    return message;
  }
}

/** The row's payload as text (jsonb/json/text columns arrive as UTF-8). */
export function payloadText(row) {
  return utf8Decode(row.payload);
}

/** A message under construction; `transform` returns an array of them. */
export class Message {
  /** A message to `topic` with no key, no payload (a tombstone until `.payload()`), no
   * headers and the partition left to Kafka's partitioner (by key). */
  static to(topic) {
    return new Message(topic);
  }

  constructor(topic) {
    this.topic = String(topic);
    this._key = null;
    this._payload = null;
    this._headers = [];
    this._partition = null;
    this._valueRecord = null;
    this._keyRecord = null;
    this._timestampMs = null;
  }

  key(key) {
    this._key = key === null || key === undefined ? null : toBytes(key);
    return this;
  }

  payload(payload) {
    this._payload = payload === null || payload === undefined ? null : toBytes(payload);
    return this;
  }

  header(name, value) {
    this._headers.push([String(name), toBytes(value)]);
    return this;
  }

  headers(headers) {
    for (const [name, value] of headers) {
      this.header(name, value);
    }
    return this;
  }

  partition(partition) {
    this._partition = partition;
    return this;
  }

  /** With `value_format` set for the tenant: the Avro record or Protobuf message (full name)
   * the value is encoded as, in place of the section's `value_record`. */
  valueRecord(record) {
    this._valueRecord = String(record);
    return this;
  }

  /** As `valueRecord`, for the key (`key_format`). */
  keyRecord(record) {
    this._keyRecord = String(record);
    return this;
  }

  /** The record's timestamp, in milliseconds since the epoch (Kafka's record timestamp;
   * docs/brokers.md, "Timestamps"). Unset: the producer's time. */
  timestampMs(ms) {
    this._timestampMs = ms;
    return this;
  }

  /** The row's `created_at` as the timestamp, as the reference plugins and the builtin router
   * do (none for a time before the epoch, which Kafka refuses). */
  timestampOf(row) {
    this._timestampMs = row.createdAtMs >= 0 ? row.createdAtMs : null;
    return this;
  }

  /** The WIT `output-message` record. */
  toWit() {
    return {
      topic: this.topic,
      key: this._key,
      payload: this._payload,
      headers: this._headers,
      partition: this._partition,
      valueRecord: this._valueRecord,
      keyRecord: this._keyRecord,
      timestampMs: this._timestampMs,
    };
  }
}

// ---- errors and config --------------------------------------------------------------------

/** Throw from `transform` to fail a row: nothing of it is published. `retryable`: the host
 * retries with back-off, then dead-letters. `permanent`: dead-lettered at once. */
export class TransformError extends Error {
  static retryable(code, message) {
    return new TransformError(true, code, message);
  }

  static permanent(code, message) {
    return new TransformError(false, code, message);
  }

  constructor(retryable, code, message) {
    super(`${code}: ${message}`);
    this.name = "TransformError";
    this.isRetryable = retryable;
    this.code = String(code);
    this.detail = String(message);
  }

  /** The WIT `transform-error` variant. */
  toWit() {
    return {
      tag: this.isRetryable ? "retryable" : "permanent",
      val: { code: this.code, message: this.detail },
    };
  }
}

/** A bad `config` table: its message becomes `configure`'s error, with which `sluice run`
 * quarantines the tenant (its rows wait; with `strict_startup` it refuses to start). */
export class ConfigError extends Error {
  constructor(message) {
    super(message);
    this.name = "ConfigError";
  }
}

/** The tenant's `config` table from sluice.toml, as string pairs. */
export class Config {
  constructor(pairs) {
    this.pairs = pairs.map(([k, v]) => [k, v]);
  }

  get(key) {
    for (const [k, v] of this.pairs) {
      if (k === key) {
        return v;
      }
    }
    return null;
  }

  getOr(key, fallback) {
    const value = this.get(key);
    return value === null ? fallback : value;
  }

  require(key) {
    const value = this.get(key);
    if (value === null) {
      throw new ConfigError(`missing required config key ${quote(key)}`);
    }
    return value;
  }

  /** Refuses keys other than `known`, so a typo in sluice.toml is reported, not ignored. */
  allowOnly(known) {
    for (const [k] of this.pairs) {
      if (!known.includes(k)) {
        throw new ConfigError(`unknown config key ${quote(k)} (known keys: ${known.join(", ")})`);
      }
    }
  }
}

// ---- the plugin ---------------------------------------------------------------------------

/** What a plugin implements. One object is made per tenant instance by `configure` and used
 * for every row of that tenant. Set `static NAME`, `static VERSION` and optionally
 * `static CONFIG_SCHEMA` (JSON Schema text shown by `sluice plugin check`), and
 * `static SCHEMAS` (`[{recordName, format: "avro" | "protobuf" | "json-schema", schema}]`: the
 * schemas of the records it emits, which a tenant with `auto_register = true` and no schema
 * file registers). */
export class Plugin {
  /** Builds the plugin from the tenant's config; throw ConfigError (or anything) to refuse
   * it. The default accepts no keys. */
  static configure(config) {
    config.allowOnly([]);
    return new this();
  }

  /** Returns the row's messages (an array of Message; empty drops the row). Throw a
   * TransformError to fail it. */
  transform(_row) {
    throw new Error("transform is not implemented");
  }

  /** One entry per row, in order: its messages, or the TransformError that failed it.
   * Defaults to `transform` per row. */
  transformBatch(rows) {
    return rows.map((row) => rowResult(this, row));
  }
}

/** Host logging, tagged with the tenant by the host; cut at 1 KiB, rate-limited. */
export const log = {
  log: (level, text) => host.log(level, String(text)),
  debug: (text) => host.log("debug", String(text)),
  info: (text) => host.log("info", String(text)),
  warn: (text) => host.log("warn", String(text)),
  error: (text) => host.log("error", String(text)),
};

// console.* -> the host's log, at the matching level.
const consoleToHost = (level) => (...args) => host.log(level, args.map(String).join(" "));
globalThis.console = {
  log: consoleToHost("info"),
  info: consoleToHost("info"),
  debug: consoleToHost("debug"),
  trace: consoleToHost("trace"),
  warn: consoleToHost("warn"),
  error: consoleToHost("error"),
};

/** Adds `delta` to a host-side counter called `name`. */
export function counterAdd(name, delta) {
  host.counterAdd(String(name), delta);
}

function describe(e) {
  if (!(e instanceof Error)) {
    return `thrown value: ${String(e)}`;
  }
  let text = `${e.name}: ${e.message}`;
  const frame = String(e.stack || "")
    .split("\n")
    .map((line) => line.trim())
    .find((line) => line.startsWith("at "));
  if (frame) {
    text += ` (${frame})`;
  }
  return text;
}

function uncaught(e) {
  return TransformError.retryable("uncaught-exception", describe(e));
}

function rowResult(plugin, row) {
  try {
    return Array.from(plugin.transform(row));
  } catch (e) {
    return e instanceof TransformError ? e : uncaught(e);
  }
}

function messagesToWit(messages) {
  return messages.map((m) => (m instanceof Message ? m.toWit() : m));
}

function notConfigured() {
  return TransformError.permanent("not-configured", "configure was not called");
}

/** The `sluice:plugin/transformer` export: `export const transformer = exportPlugin(MyPlugin);` */
export function exportPlugin(PluginClass) {
  let plugin = null;
  return {
    info() {
      return {
        name: String(PluginClass.NAME ?? "unnamed"),
        version: String(PluginClass.VERSION ?? "0.0.0"),
        configSchema: PluginClass.CONFIG_SCHEMA ?? null,
        // [{recordName, format: "avro" | "protobuf" | "json-schema", schema}]
        schemas: PluginClass.SCHEMAS ?? [],
      };
    },

    configure(pairs) {
      try {
        plugin = PluginClass.configure(new Config(pairs));
      } catch (e) {
        // A top-level `result<_, string>`: the thrown value is the error.
        throw e instanceof ConfigError ? e.message : describe(e);
      }
    },

    transform(row) {
      const result = plugin === null ? notConfigured() : rowResult(plugin, row);
      if (result instanceof TransformError) {
        throw result.toWit();
      }
      return messagesToWit(result);
    },

    transformBatch(rows) {
      if (plugin === null) {
        return rows.map(() => ({ tag: "err", val: notConfigured().toWit() }));
      }
      let results;
      try {
        results = plugin.transformBatch(rows);
      } catch (e) {
        const failure = e instanceof TransformError ? e : uncaught(e);
        return rows.map(() => ({ tag: "err", val: failure.toWit() }));
      }
      return results.map((r) =>
        r instanceof TransformError
          ? { tag: "err", val: r.toWit() }
          : { tag: "ok", val: messagesToWit(Array.from(r)) },
      );
    },
  };
}
