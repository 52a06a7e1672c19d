-- Upgrades an outbox table of schema version 2 to version 3 on PostgreSQL,
-- in one transaction; db.Use runs it when it finds a version 2 table (unless
-- Config.DisableAutoMigrate is set; a version 1 table gets
-- postgres-upgrade-2.sql first). For another table name, replace every
-- outbox_events (outbox.UpgradeSQL does this for you). It rewrites the
-- table: expect it to hold the lock for seconds per million rows.
BEGIN;
LOCK TABLE "outbox_events" IN ACCESS EXCLUSIVE MODE;
-- Indexes and the check that name status go before its type changes.
DROP INDEX IF EXISTS "outbox_events_pending_idx";
DROP INDEX IF EXISTS "outbox_events_sent_idx";
DROP INDEX IF EXISTS "outbox_events_aggregate_idx";
DROP INDEX IF EXISTS "outbox_events_idempotency_key_idx";
ALTER TABLE "outbox_events" DROP CONSTRAINT IF EXISTS "outbox_events_status_check";
CREATE TYPE "outbox_events_status" AS ENUM ('pending', 'sent', 'failed');
ALTER TABLE "outbox_events" ALTER COLUMN status DROP DEFAULT;
ALTER TABLE "outbox_events" ALTER COLUMN status TYPE "outbox_events_status" USING status::text::"outbox_events_status";
ALTER TABLE "outbox_events" ALTER COLUMN status SET DEFAULT 'pending';
-- Version 2 did not record which IDs a publisher chose: every existing ID
-- counts as chosen, so each stays unique, and reads back as it was written.
ALTER TABLE "outbox_events" DROP CONSTRAINT "outbox_events_pkey";
ALTER TABLE "outbox_events" ADD PRIMARY KEY (seq);
ALTER TABLE "outbox_events" RENAME COLUMN id TO named_id;
ALTER TABLE "outbox_events" ALTER COLUMN named_id DROP NOT NULL;
ALTER TABLE "outbox_events" ADD COLUMN id uuid;
ALTER TABLE "outbox_events" ALTER COLUMN idempotency_key DROP NOT NULL;
UPDATE "outbox_events" SET id = CASE
        WHEN named_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN named_id::uuid
        ELSE md5('outbox:' || named_id)::uuid END,
    idempotency_key = NULLIF(idempotency_key, named_id);
ALTER TABLE "outbox_events" ALTER COLUMN id SET NOT NULL;
ALTER TABLE "outbox_events" ALTER COLUMN available_at DROP NOT NULL;
ALTER TABLE "outbox_events" ALTER COLUMN created_at DROP NOT NULL;
ALTER TABLE "outbox_events" ALTER COLUMN updated_at DROP NOT NULL;
CREATE UNIQUE INDEX "outbox_events_named_id_idx"
    ON "outbox_events" (named_id) WHERE named_id IS NOT NULL;
CREATE UNIQUE INDEX "outbox_events_idempotency_key_idx"
    ON "outbox_events" (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX "outbox_events_retry_idx"
    ON "outbox_events" (available_at) WHERE status = 'pending' AND available_at IS NOT NULL;
CREATE INDEX "outbox_events_sent_idx"
    ON "outbox_events" (sent_at) WHERE status = 'sent';
COMMIT;
