// Reference plugin with the defaults of Debezium's Outbox Event Router, in JavaScript: topic
// `<topic_prefix><aggregate_type>`, key = aggregate id, payload unchanged, headers = the row's
// headers plus `id` (outbox id) and `event-type`.
//
// Config: `topic_prefix` (default `outbox.event.`). The port of
// plugins/route-by-aggregate/src/lib.rs; tests/conformance checks the two give byte-identical
// output.

import { Message, Plugin, TransformError, exportPlugin } from "../sdk-js/sluice-plugin.js";

const DEFAULT_TOPIC_PREFIX = "outbox.event.";

class RouteByAggregate extends Plugin {
  static NAME = "route-by-aggregate";
  static VERSION = "0.1.0";
  static CONFIG_SCHEMA =
    '{"type":"object","properties":{"topic_prefix":{"type":"string","default":"outbox.event."}},"additionalProperties":false}';

  constructor(topicPrefix) {
    super();
    this.topicPrefix = topicPrefix;
  }

  static configure(config) {
    config.allowOnly(["topic_prefix"]);
    return new RouteByAggregate(config.getOr("topic_prefix", DEFAULT_TOPIC_PREFIX));
  }

  transform(row) {
    if (row.aggregateType === "") {
      throw TransformError.permanent(
        "empty-aggregate-type",
        "aggregate_type is empty, so there is no topic to route to",
      );
    }
    return [
      Message.to(this.topicPrefix + row.aggregateType)
        .key(row.aggregateId)
        .payload(row.payload)
        .headers(row.headers)
        .header("id", row.id)
        .header("event-type", row.eventType),
    ];
  }
}

export const transformer = exportPlugin(RouteByAggregate);
