-- Retry bookkeeping, added in place to a table of the reference article's
-- shape (never recreated: it may hold unpublished events). Each column is
-- added only when missing: ALTER TABLE takes an exclusive lock even when
-- it has nothing to do, and that would stall the producers' inserts on
-- every deploy. Adding a column with a constant or now() default is a
-- catalog-only change since PostgreSQL 11: no rewrite of a large table.
--
-- The block finds the table through the setting outbox_poll.table, which
-- `outbox-poll migrate` sets to --table as a bind parameter (psql -f: the
-- table outbox), and builds its statements with format('%s', regclass):
-- the table's name is never pasted into the block's text, so no name can
-- break out of it.
DO $$
DECLARE
    target regclass := coalesce(nullif(current_setting('outbox_poll.table', true), ''),
                                'outbox')::regclass;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = target
                   AND attname = 'attempts' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN attempts integer NOT NULL DEFAULT 0', target);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = target
                   AND attname = 'last_error' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN last_error text', target);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = target
                   AND attname = 'available_at' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN available_at timestamptz NOT NULL DEFAULT now()',
                       target);
    END IF;
END
$$;

-- The claim walks unpublished rows in id order; published rows, the bulk of
-- an old table, stay out of this index. Built once, by the first migrate:
-- on a large existing table that build blocks inserts while it runs, so
-- run that first migrate at a quiet time (or create this index
-- CONCURRENTLY by hand beforehand; migrate then finds it and moves on).
CREATE INDEX IF NOT EXISTS "outbox_pending_idx" ON "outbox" (id) WHERE published_at IS NULL;
