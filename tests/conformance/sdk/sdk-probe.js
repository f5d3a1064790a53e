// Exercises the JavaScript SDK through a real component: each row's event_type picks one
// behaviour (see rows.jsonl). Run by tests/conformance/run: output must equal expected.jsonl,
// as the Python probe's must.

import {
  Message,
  Plugin,
  TransformError,
  counterAdd,
  exportPlugin,
  header,
  log,
  payloadText,
} from "../../../plugins/sdk-js/sluice-plugin.js";

class SdkProbe extends Plugin {
  static NAME = "sdk-probe";
  static VERSION = "0.1.0";
  static SCHEMAS = [
    {
      recordName: "com.acme.Probe",
      format: "avro",
      schema: '{"type":"record","name":"Probe","namespace":"com.acme","fields":[]}',
    },
  ];

  constructor(suffix) {
    super();
    this.suffix = suffix;
  }

  static configure(config) {
    config.allowOnly(["suffix"]);
    return new SdkProbe(config.require("suffix"));
  }

  transform(row) {
    switch (row.eventType) {
      case "fan-out":
        return [
          Message.to("a" + this.suffix).key(row.aggregateId).payload(row.payload),
          Message.to("b" + this.suffix).key(new Uint8Array([0xff, 0])).payload("ü").partition(1),
        ];
      case "filter":
        return [];
      case "tombstone":
        return [Message.to("t").key(row.aggregateId)];
      case "echo-header": {
        const value = header(row, "x");
        return [Message.to("h").payload(value === null ? "missing" : value)];
      }
      case "retryable":
        throw TransformError.retryable("busy", "try again later");
      case "permanent":
        throw TransformError.permanent("bad-row", "cannot route this");
      case "crash":
        return [Message.to(row.noSuchField.length)];
      case "text":
        return [Message.to("text").payload(payloadText(row).toUpperCase())];
      case "fields":
        return [Message.to("f").payload(`${row.id}|${row.tenant}|${row.attempt}|${row.createdAtMs}`)];
      case "host":
        log.info(`row ${row.id} says hello`);
        console.log(`row ${row.id} prints`);
        counterAdd("probe.rows", 1);
        return [];
      case "sandbox": {
        // Documents the sandbox: clocks frozen at 0 (1970), randomness available.
        const r = Math.random();
        const inRange = r >= 0 && r < 1 ? "yes" : "no";
        return [Message.to("s").payload(`time=${Math.trunc(Date.now() / 1000)} random-in-range=${inRange}`)];
      }
      case "records":
        return [Message.to("r").payload(row.payload).valueRecord("com.acme.Probe").keyRecord("com.acme.Key")];
      default:
        throw TransformError.permanent("unknown-kind", row.eventType);
    }
  }
}

export const transformer = exportPlugin(SdkProbe);
