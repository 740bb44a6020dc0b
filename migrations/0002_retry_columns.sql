-- Retry bookkeeping, added in place to a table of the reference article's
-- shape (never recreated: it may hold unpublished events). Adding a column
-- with a constant or now() default is a catalog-only change since
-- PostgreSQL 11, so this does not rewrite a large table.
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS last_error text;
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS available_at timestamptz NOT NULL DEFAULT now();

-- The claim walks unpublished rows in id order; published rows, the bulk of
-- an old table, stay out of this index.
CREATE INDEX IF NOT EXISTS "outbox_pending_idx" ON "outbox" (id) WHERE published_at IS NULL;
