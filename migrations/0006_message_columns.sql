-- The optional message columns of the README's "Optional columns": where
-- an event goes (exchange), what its message says of itself
-- (content_type, content_encoding, correlation_id, priority), and until
-- when it is worth sending (expires_at). All nullable, so producers that
-- do not set them change nothing; the relay uses each only where a table
-- has it. Each is added only when missing, for the reason 0002 gives
-- (ALTER TABLE takes an exclusive lock even with nothing to do); a
-- nullable column without a default is a catalog-only change: no rewrite.
--
-- The block finds the table through the setting outbox_poll.table, as 0002
-- does, so no name is ever pasted into its text.
DO $$
DECLARE
    target regclass := coalesce(nullif(current_setting('outbox_poll.table', true), ''),
                                'outbox')::regclass;
    optional record;
BEGIN
    FOR optional IN SELECT * FROM (VALUES ('exchange', 'text'), ('content_type', 'text'),
                                          ('content_encoding', 'text'),
                                          ('correlation_id', 'text'), ('priority', 'smallint'),
                                          ('expires_at', 'timestamptz')) AS c(name, type) LOOP
        IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = target
                       AND attname = optional.name AND NOT attisdropped) THEN
            EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s', target, optional.name, optional.type);
        END IF;
    END LOOP;
END
$$;
