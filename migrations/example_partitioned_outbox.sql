-- EXAMPLE, not a migration: `outbox-poll migrate` does not apply this file
-- (it embeds only the NNNN_*.sql files). It creates the outbox as a table
-- partitioned by day on created_at, so that `outbox-poll prune` can drop
-- old days whole: milliseconds per day, and the space back at once, where
-- deleting millions of rows one by one takes minutes and leaves the space
-- to vacuum. Run it once, as the table's owner, before the first migrate,
-- then migrate as usual (it adds the pending index and the rest):
--   psql -v ON_ERROR_STOP=1 -f migrations/example_partitioned_outbox.sql
--   outbox-poll migrate
-- Adapt the table's name (here outbox, in the first schema of the
-- search_path) and the days created ahead. An existing plain table cannot
-- become partitioned in place: create this one beside it, switch the
-- producers over, and drain the old one with `outbox-poll --table OLD
-- --drain` until it is empty.
--
-- The relay, status and requeue work on it unchanged, and prune drops
-- every partition whose range ends before --older-than and whose rows
-- were all published before then (never one holding an unpublished or a
-- dead event), then deletes the rest row by row.
--
-- What partitioning costs:
--
-- - A unique index must include the partition key. The primary key is
--   (id, created_at): id still comes from one sequence, so it stays unique
--   in practice, but nothing checks it. event_id is unique per created_at
--   only, UNIQUE (event_id, created_at): the contract's "event_id text not
--   null unique" no longer holds across the table. A producer that inserts
--   an event_id twice (a retried transaction) gets two rows, and two
--   messages, unless both inserts carry the same created_at; and INSERT
--   ... ON CONFLICT (event_id) needs a unique index on event_id alone,
--   which a partitioned table cannot have. Consumers de-duplicate by
--   message_id in any case (delivery is at-least-once), so a duplicate is
--   a repeated message, never a lost one; a producer that needs the
--   database to refuse a second event_id needs the plain table.
-- - Each claim reads the pending index of every partition (PostgreSQL
--   cannot tell from the claim which days hold pending rows), and each
--   batch's transaction locks every partition and its indexes. Keep the
--   partitions few (about two months of days: see the README's Scaling),
--   and size max_locks_per_transaction for the partitions times the
--   batches in flight of all the runs at once.
-- - An INSERT whose created_at falls in no partition fails: the producer's
--   transaction with it. Create partitions ahead, daily and with a margin
--   (cron or pg_cron: SELECT outbox_add_partitions('outbox', current_date, 14);).
--   There is no DEFAULT partition on purpose: one would take such rows,
--   but then every new partition must be checked against it, and it can
--   never be dropped.

CREATE TABLE IF NOT EXISTS "outbox" (
    id           bigserial   NOT NULL,
    event_id     text        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    available_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at),
    UNIQUE (event_id, created_at)
) PARTITION BY RANGE (created_at);

-- Creates the missing daily partitions of `parent` from first_day on, for
-- `days` days, each from midnight UTC to the next, named after the parent
-- and the day (outbox_p20261203), beside it. Returns how many it created.
-- A new partition takes the storage settings of an existing one, so the
-- autovacuum settings `outbox-poll migrate` gives each partition
-- (migration 0005) carry over to the days added later.
CREATE OR REPLACE FUNCTION outbox_add_partitions(parent regclass, first_day date, days integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    schema_name name;
    table_name name;
    settings text;
    day date;
    partition_name text;
    added integer := 0;
BEGIN
    SELECT n.nspname, c.relname INTO schema_name, table_name
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = parent;
    SELECT array_to_string(c.reloptions, ', ') INTO settings
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
      WHERE i.inhparent = parent AND c.reloptions IS NOT NULL
      ORDER BY c.oid DESC LIMIT 1;
    FOR day IN SELECT generate_series(first_day, first_day + days - 1, interval '1 day')::date LOOP
        partition_name := table_name || '_p' || to_char(day, 'YYYYMMDD');
        IF NOT EXISTS (SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       WHERE i.inhparent = parent AND c.relname = partition_name) THEN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)%s',
                           schema_name, partition_name, parent,
                           day::timestamp AT TIME ZONE 'UTC',
                           (day + 1)::timestamp AT TIME ZONE 'UTC',
                           coalesce(' WITH (' || settings || ')', ''));
            added := added + 1;
        END IF;
    END LOOP;
    RETURN added;
END
$$;

-- Yesterday (so a clock a little behind still finds a partition), today,
-- and the next 14 days.
SELECT outbox_add_partitions('outbox', current_date - 1, 16);
