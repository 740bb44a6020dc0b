-- Ordering and the optional message columns, added in place (never
-- recreated: the table may hold unpublished events). Each column is added
-- only when missing, for the reason 0002 gives: ALTER TABLE takes an
-- exclusive lock even when it has nothing to do.
--
-- producer_xid records the transaction that inserted the row. The ordered
-- modes sort by (producer_xid, id), which is each producer's commit order
-- (a producer's later transaction gets a larger xid), and publish a row
-- only once every transaction that could still insert a row sorting
-- before it has ended: its xid is below the oldest xid still running in
-- this database (src/sql/outbox.rs, HORIZON). It is added
-- with the constant default '0' first, a catalog-only change since
-- PostgreSQL 11 (no rewrite, no scan): rows already in the table read as
-- 0, the oldest, which they are, since they are committed. Only then does
-- the default become pg_current_xact_id(), for the rows inserted from now
-- on; a volatile default on ADD COLUMN would rewrite the whole table.
-- NOT NULL keeps producers from inserting a row the order cannot place.
--
-- headers, routing_key and ordering_key are the optional message columns:
-- nullable, and used by the relay only where a table has them.
--
-- The block finds the table through the setting outbox_poll.table, as 0002
-- does, so no name is ever pasted into its text.
DO $$
DECLARE
    target regclass := coalesce(nullif(current_setting('outbox_poll.table', true), ''),
                                'outbox')::regclass;
    optional record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = target
                   AND attname = 'producer_xid' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN producer_xid xid8 NOT NULL DEFAULT ''0''',
                       target);
        EXECUTE format('ALTER TABLE %s ALTER COLUMN producer_xid SET DEFAULT pg_current_xact_id()',
                       target);
    END IF;
    FOR optional IN SELECT * FROM (VALUES ('headers', 'jsonb'), ('routing_key', 'text'),
                                          ('ordering_key', 'text')) AS c(name, type) LOOP
        IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = target
                       AND attname = optional.name AND NOT attisdropped) THEN
            EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s', target, optional.name, optional.type);
        END IF;
    END LOOP;
END
$$;

-- The unpublished rows in (producer_xid, id) order, in two halves: rows
-- without a key, which --ordered and --ordered-by-key read, and rows with
-- one, which --ordered merges with the first. Each row enters one of them.
CREATE INDEX IF NOT EXISTS "outbox_unkeyed_order_idx" ON "outbox" (producer_xid, id)
    WHERE published_at IS NULL AND ordering_key IS NULL;
CREATE INDEX IF NOT EXISTS "outbox_keyed_order_idx" ON "outbox" (producer_xid, id)
    WHERE published_at IS NULL AND ordering_key IS NOT NULL;

-- --ordered-by-key finds the first unpublished event of each key here.
-- Only rows with a key enter it (and the keyed half above): producers
-- that never set a key pay for one index only.
--
-- The three indexes are built once, by the first migrate: on a large
-- existing table that build blocks inserts while it runs, so run that
-- first migrate at a quiet time (or create them CONCURRENTLY by hand
-- beforehand, with the columns above; migrate then finds them and moves
-- on).
CREATE INDEX IF NOT EXISTS "outbox_key_order_idx" ON "outbox" (ordering_key, producer_xid, id)
    WHERE published_at IS NULL AND ordering_key IS NOT NULL;
