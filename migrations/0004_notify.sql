-- Opt-in: the trigger that wakes `outbox-poll --follow` the moment a
-- producer's insert commits, instead of at its next poll (at most 250 ms
-- later). `outbox-poll migrate --notify` installs it; a plain `migrate`
-- runs this file too but changes nothing, and never removes a trigger
-- installed before. With psql, for a table named outbox:
--   psql -c "SET outbox_poll.notify = on" -f migrations/0004_notify.sql
-- To remove it: DROP TRIGGER outbox_poll_notify ON outbox;
--
-- Why opt-in: PostgreSQL serialises the commits of all transactions that
-- sent a notification (one lock, held through the commit's WAL flush), so
-- producers that commit concurrently lose their group commit: in this
-- project's benchmark 8 concurrent single-row producers went from 2,205
-- to 296 commits/s (-87%), 8 producers of 100-row transactions lost 67%;
-- a single producer lost nothing measurable. See the README, Low latency.
--
-- FOR EACH STATEMENT: a producer's INSERT notifies once however many rows
-- it adds, and PostgreSQL folds identical notifications of one transaction
-- into one. The channel is 'outbox_poll_' || the table's oid, computed from
-- TG_RELID, so two outbox tables never wake each other's followers and the
-- function serves every outbox table of its schema. The function lives in
-- the table's schema, where producers already have USAGE.
--
-- Creating a trigger takes a lock that stalls inserts for a moment, so it
-- is created only when missing. As in 0002, the table comes from the
-- setting outbox_poll.table (a bind parameter of `migrate`), and every
-- statement is built with format(): no name is pasted into this text.
DO $$
DECLARE
    target regclass := coalesce(nullif(current_setting('outbox_poll.table', true), ''),
                                'outbox')::regclass;
    home oid := (SELECT relnamespace FROM pg_class WHERE oid = target);
BEGIN
    IF coalesce(current_setting('outbox_poll.notify', true), '') <> 'on' THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'outbox_poll_notify'
                   AND pronamespace = home) THEN
        EXECUTE format($create$
            CREATE FUNCTION %I.outbox_poll_notify() RETURNS trigger LANGUAGE plpgsql AS $body$
            BEGIN
                PERFORM pg_catalog.pg_notify('outbox_poll_' || TG_RELID::text, '');
                RETURN NULL;
            END
            $body$
        $create$, (SELECT nspname FROM pg_namespace WHERE oid = home));
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = target
                   AND tgname = 'outbox_poll_notify') THEN
        EXECUTE format('CREATE TRIGGER outbox_poll_notify AFTER INSERT ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION %I.outbox_poll_notify()',
                       target, (SELECT nspname FROM pg_namespace WHERE oid = home));
    END IF;
END
$$;
