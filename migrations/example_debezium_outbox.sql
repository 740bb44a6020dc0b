-- EXAMPLE, not a migration: `outbox-poll migrate` does not apply this file.
-- The outbox table of Debezium's outbox event router, as its documentation
-- gives it (the router's defaults: id, aggregatetype, aggregateid, type,
-- payload; no timestamp column, the router takes the change event's).
-- Producers insert a row in the transaction of the business change:
--
--   INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
--   VALUES (gen_random_uuid(), 'order', '123', 'OrderCreated', '{"id": 123}');
--
-- To relay it with outbox-poll instead of Debezium, adopt it once, then
-- poll it, both with the same mapping of its names (README, "Adopting an
-- existing table"):
--
--   outbox-poll --column event_id=id,event_type=type,routing_key=aggregatetype migrate --adopt
--   outbox-poll --column event_id=id,event_type=type,routing_key=aggregatetype --drain
--
-- Adopt adds the claim order (a bigint identity column outbox_seq: id is a
-- uuid, which gives none), created_at (the relay's AMQP timestamp and its
-- ages), the relay's own columns and its indexes; it changes none of the
-- columns below. Producers keep inserting exactly what they insert now,
-- but must leave the row in the table: Debezium reads the insert from the
-- WAL and lets a producer delete the row at once, outbox-poll reads the
-- table.
--
-- Plain SQL: `psql -f` it as it is, or with a search_path for another schema.
CREATE TABLE IF NOT EXISTS outbox (
    id            uuid         NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb
);
