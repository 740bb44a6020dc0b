-- EXAMPLE, not a migration: `outbox-poll migrate` does not apply this file
-- (it embeds only the NNNN_*.sql files). Adapt the role names, the schema
-- and the table, then run it once as the table's owner, e.g.
--   psql -v ON_ERROR_STOP=1 -f migrations/example_least_privilege_role.sql
--
-- The relay (poll, status, requeue) reads and updates rows and does
-- nothing else: no INSERT, no DDL, and no DELETE unless it runs with
-- --on-publish delete. It needs no USAGE on the id sequence either,
-- since it never inserts.
CREATE ROLE outbox_relay LOGIN;
GRANT USAGE ON SCHEMA public TO outbox_relay;
GRANT SELECT, UPDATE ON "outbox" TO outbox_relay;
-- With --on-publish delete (OUTBOX_ON_PUBLISH=delete) the relay deletes
-- the events the broker confirmed, and needs DELETE too; without it such
-- a run exits 78 before it publishes anything:
--   GRANT DELETE ON "outbox" TO outbox_relay;

-- The pruner (`outbox-poll prune`) reads and deletes old rows. Without
-- DELETE, prune exits 78 saying which privilege is missing. On a
-- partitioned outbox (example_partitioned_outbox.sql) this role prunes row
-- by row: dropping whole partitions is the table owner's, so run prune as
-- the owner to have old days dropped (and their space returned at once).
CREATE ROLE outbox_pruner LOGIN;
GRANT USAGE ON SCHEMA public TO outbox_pruner;
GRANT SELECT, DELETE ON "outbox" TO outbox_pruner;

-- Monitoring that only runs `outbox-poll status` needs SELECT alone:
--   GRANT USAGE ON SCHEMA public TO outbox_monitor;
--   GRANT SELECT ON "outbox" TO outbox_monitor;
--
-- Passwords: ALTER ROLE outbox_relay PASSWORD '...'; or, better, a
-- pg_hba.conf rule for peer or certificate authentication.
