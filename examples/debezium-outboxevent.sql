-- The table examples/debezium.toml relays from: Debezium's default outbox table (as the
-- Outbox Event Router and the Quarkus/Spring outbox extensions write it) plus a tenant column.
-- Your application creates it (or already has it); `sluice migrate --config
-- examples/debezium.toml` then adds what Sluice needs, all with defaults, so writers keep
-- inserting exactly these columns. See docs/debezium.md.
CREATE TABLE outboxevent (
  id            uuid         NOT NULL DEFAULT gen_random_uuid(),
  tenant_id     varchar(64),             -- NULL: the row runs [plugins.default]
  aggregatetype varchar(255) NOT NULL,
  aggregateid   varchar(255) NOT NULL,
  type          varchar(255) NOT NULL,
  payload       jsonb,
  PRIMARY KEY (id)
);

-- What a writer does, in the transaction that changes the aggregate:
-- INSERT INTO outboxevent (tenant_id, aggregatetype, aggregateid, type, payload)
-- VALUES ('acme', 'order', '1042', 'OrderPlaced', '{"total": 99.5}');
