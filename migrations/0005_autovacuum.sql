-- Autovacuum settings for the outbox, set per table.
--
-- The outbox is a queue: every row is inserted, then marked published (an
-- UPDATE, which leaves the old row version dead) or deleted (with
-- --on-publish delete), and published rows are deleted by prune. Dead
-- versions stay in the heap and in every index until vacuum removes them,
-- and each claim walks past the pending index's entries for them. The
-- server's defaults vacuum a table once 20% of it is dead: on a table of
-- 5,000,000 rows, a million dead versions before the first vacuum. Here:
--
-- autovacuum_vacuum_scale_factor = 0.01 and autovacuum_vacuum_threshold =
--   1000: vacuum once 1,000 versions plus 1% of the table are dead. A
--   vacuum of a table that holds only a backlog (the usual state, and
--   always so with --on-publish delete) reads a few pages, so running it
--   often costs little; on a large table of published rows, 1% is 50,000
--   dead versions of 5,000,000 instead of a million.
--
-- Left at the server's settings, on purpose:
--
-- autovacuum_vacuum_insert_scale_factor: an insert-driven vacuum only
--   freezes pages and sets them all-visible. Every row here is updated
--   or deleted soon after its insert, and the vacuums that follow do the
--   same work on the same pages.
-- fillfactor: free space on a page lets an UPDATE stay on it (a HOT
--   update, with no new index entries) only when no indexed column
--   changes, and the mark changes published_at, which is in the pending
--   index's predicate: no fillfactor makes the mark HOT. Only the rarer
--   updates (a failed attempt, requeue) could be, not worth leaving 10%
--   of every page empty. --on-publish delete avoids the update entirely.
--
-- Each setting is set only where the table has none of its own, so an
-- operator's own tuning is never overwritten by a later migrate, and a
-- second migrate takes no lock at all. ALTER TABLE ... SET takes a SHARE
-- UPDATE EXCLUSIVE lock: it does not block inserts, claims or marks.
--
-- A partitioned table cannot take storage settings itself (PostgreSQL
-- refuses them on the parent): they are set on each of its partitions
-- instead, as they are now; a partition added later gets them from the
-- next migrate, or (migrations/example_partitioned_outbox.sql) from
-- outbox_add_partitions, which copies an existing partition's.
--
-- The block finds the table through the setting outbox_poll.table (see
-- 0002); the settings are constants of this file, never input.
DO $$
DECLARE
    target regclass := coalesce(nullif(current_setting('outbox_poll.table', true), ''),
                                'outbox')::regclass;
    leaf regclass;
    setting text;
BEGIN
    FOR leaf IN SELECT oid FROM pg_class WHERE relkind = 'r' AND (oid = target
                  OR oid IN (SELECT relid FROM pg_partition_tree(target))) LOOP
        FOREACH setting IN ARRAY ARRAY['autovacuum_vacuum_scale_factor=0.01',
                                       'autovacuum_vacuum_threshold=1000'] LOOP
            IF NOT EXISTS (SELECT FROM pg_class, unnest(reloptions) AS option
                           WHERE oid = leaf
                             AND split_part(option, '=', 1) = split_part(setting, '=', 1)) THEN
                EXECUTE format('ALTER TABLE %s SET (%s)', leaf, setting);
            END IF;
        END LOOP;
    END LOOP;
END
$$;
