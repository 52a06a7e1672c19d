-- Upgrades an outbox table of schema version 1 to version 2 on PostgreSQL,
-- in one transaction; db.Use runs it when it finds a version 1 table (unless
-- Config.DisableAutoMigrate is set). For another table name, replace every
-- outbox_events (outbox.UpgradeSQL does this for you).
BEGIN;
LOCK TABLE "outbox_events" IN ACCESS EXCLUSIVE MODE;
-- seq numbers the existing rows in the order version 1 delivered them.
ALTER TABLE "outbox_events" ADD COLUMN seq bigint;
UPDATE "outbox_events" AS t SET seq = o.n
    FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM "outbox_events") AS o
    WHERE t.id = o.id;
ALTER TABLE "outbox_events" ALTER COLUMN seq SET NOT NULL;
ALTER TABLE "outbox_events" ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;
SELECT setval(pg_get_serial_sequence('"outbox_events"', 'seq'), COALESCE(MAX(seq), 0) + 1, false) FROM "outbox_events";
ALTER TABLE "outbox_events" DROP CONSTRAINT IF EXISTS "outbox_events_idempotency_key_key";
CREATE UNIQUE INDEX "outbox_events_idempotency_key_idx"
    ON "outbox_events" (idempotency_key) WHERE idempotency_key <> id;
DROP INDEX IF EXISTS "outbox_events_pending_idx";
CREATE INDEX "outbox_events_pending_idx"
    ON "outbox_events" (available_at, seq) WHERE status = 'pending';
-- The version 1 per-aggregate ordering index; relays that order create
-- the version 2 one.
DROP INDEX IF EXISTS "outbox_events_aggregate_idx";
COMMIT;
