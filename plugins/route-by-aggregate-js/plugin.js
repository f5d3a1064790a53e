// Reference plugin with the defaults of Debezium's Outbox Event Router, in JavaScript: topic
// `<topic_prefix><aggregate_type>`, key = aggregate id, payload unchanged, headers = the row's
// headers plus `id` (outbox id) and `event-type`, then the extra columns `additional_placement`
// places; timestamp = the row's `created_at`.
//
// Config: `topic_prefix` (default `outbox.event.`), `additional_placement` (Debezium's
// `table.fields.additional.placement`; default none). The port of
// plugins/route-by-aggregate/src/lib.rs; tests/conformance checks the two give byte-identical
// output.

import { Message, Placements, Plugin, TransformError, exportPlugin } from "../sdk-js/sluice-plugin.js";

const DEFAULT_TOPIC_PREFIX = "outbox.event.";

class RouteByAggregate extends Plugin {
  static NAME = "route-by-aggregate";
  static VERSION = "0.1.0";
  static CONFIG_SCHEMA =
    '{"type":"object","properties":{"topic_prefix":{"type":"string","default":"outbox.event."},"additional_placement":{"type":"string","default":""}},"additionalProperties":false}';

  constructor(topicPrefix, placements) {
    super();
    this.topicPrefix = topicPrefix;
    this.placements = placements;
  }

  static configure(config) {
    config.allowOnly(["topic_prefix", "additional_placement"]);
    return new RouteByAggregate(
      config.getOr("topic_prefix", DEFAULT_TOPIC_PREFIX),
      Placements.parse(config.getOr("additional_placement", "")),
    );
  }

  transform(row) {
    if (row.aggregateType === "") {
      throw TransformError.permanent(
        "empty-aggregate-type",
        "aggregate_type is empty, so there is no topic to route to",
      );
    }
    const message = Message.to(this.topicPrefix + row.aggregateType)
      .key(row.aggregateId)
      .payload(row.payload)
      .headers(row.headers)
      .header("id", row.id)
      .header("event-type", row.eventType)
      // Kafka's record timestamp: when the application wrote the row.
      .timestampOf(row);
    // Extra columns ([database.columns] extra) as headers or the partition.
    return [this.placements.apply(row, message)];
  }
}

export const transformer = exportPlugin(RouteByAggregate);
