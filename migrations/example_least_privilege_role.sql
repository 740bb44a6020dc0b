-- EXAMPLE, not a migration: `outbox-poll migrate` does not apply this file
-- (it embeds only the NNNN_*.sql files). Adapt the role names, the schema
-- and the table, then run it once as the table's owner, e.g.
--   psql -v ON_ERROR_STOP=1 -f migrations/example_least_privilege_role.sql
--
-- The relay (poll, status, requeue) reads and updates rows and does
-- nothing else: no INSERT, no DELETE, no DDL. It needs no USAGE on the id
-- sequence either, since it never inserts.
CREATE ROLE outbox_relay LOGIN;
GRANT USAGE ON SCHEMA public TO outbox_relay;
GRANT SELECT, UPDATE ON "outbox" TO outbox_relay;

-- The pruner (`outbox-poll prune`) reads and deletes old rows. Without
-- DELETE, prune exits 78 saying which privilege is missing.
CREATE ROLE outbox_pruner LOGIN;
GRANT USAGE ON SCHEMA public TO outbox_pruner;
GRANT SELECT, DELETE ON "outbox" TO outbox_pruner;

-- Monitoring that only runs `outbox-poll status` needs SELECT alone:
--   GRANT USAGE ON SCHEMA public TO outbox_monitor;
--   GRANT SELECT ON "outbox" TO outbox_monitor;
--
-- Passwords: ALTER ROLE outbox_relay PASSWORD '...'; or, better, a
-- pg_hba.conf rule for peer or certificate authentication.
