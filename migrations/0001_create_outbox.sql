-- The outbox table of the reference article. Producers insert event_id,
-- event_type and payload in the same transaction as the business change.
--
-- Plain SQL: `psql -f` it as it is for a table named outbox.
-- `outbox-poll migrate --table NAME` runs it with "outbox" replaced by NAME.
CREATE TABLE IF NOT EXISTS "outbox" (
    id           bigserial   PRIMARY KEY,
    event_id     text        NOT NULL UNIQUE,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0
);
