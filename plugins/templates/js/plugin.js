// {{name}}: a Sluice plugin. As it comes, it does what the builtin `route-by-aggregate` does
// (the defaults of Debezium's Outbox Event Router): each outbox row goes to
// `<topic_prefix><aggregate_type>` (prefix default `outbox.event.`), keyed by the aggregate
// id, with the payload unchanged and the row's headers plus `id` (the outbox id) and
// `event-type`, then the extra columns `additional_placement` places (Debezium's
// `table.fields.additional.placement`), and the row's `created_at` as the record timestamp.
// A row without an aggregate type is dead-lettered.
//
// Change `transform` to route your rows; keep rows.jsonl/expected.jsonl in step (see
// README.md). The runtime is QuickJS: no Node.js or browser APIs (no fs, fetch, TextEncoder).

import { Message, Placements, Plugin, TransformError, exportPlugin } from "./sluice-plugin.js";

const DEFAULT_TOPIC_PREFIX = "outbox.event.";

class Router extends Plugin {
  static NAME = "{{name}}";
  static VERSION = "0.1.0";

  constructor(topicPrefix, placements) {
    super();
    this.topicPrefix = topicPrefix;
    this.placements = placements;
  }

  static configure(config) {
    config.allowOnly(["topic_prefix", "additional_placement"]);
    return new Router(
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
      // Consumers of Debezium's router de-duplicate on `id`; keep it when you change the
      // routing (the host adds the unforgeable `sluice-outbox-id` as well).
      .header("id", row.id)
      .header("event-type", row.eventType)
      // Kafka's record timestamp: when the application wrote the row.
      .timestampOf(row);
    // Extra columns ([database.columns] extra) as headers or the partition.
    return [this.placements.apply(row, message)];
  }
}

export const transformer = exportPlugin(Router);
