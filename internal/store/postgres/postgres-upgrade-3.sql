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
-- Added to version 3 after its release: the overview's rollup, the
-- failed index and the event history (db.Use also creates them on a
-- version 3 table that lacks them).
-- The overview's counts (outbox.Outbox.Overview and the dashboard's charts):
-- the sent events per minute and event type, rolled up from this table by
-- the relays every few seconds (and by Overview itself when they lag), so
-- that a chart over a week reads minutes, not a million rows. Nothing on
-- the write path touches these tables. minute counts whole minutes since
-- the Unix epoch (UTC) and starts a span of 1, 10 or 60 minutes (the
-- three are kept, for charts by the minute, by 10 minutes and by the hour;
-- minutes for a day, the others 8 days); published counts the sent events
-- created in the span, delivered those sent in it, and d0..d17 the latter by delivery
-- delay (created to sent): under 1, 2.5, 5, 10, 25, 50, 100, 250, 500 ms,
-- 1, 2.5, 5, 10, 30 s, 1, 5, 30 min, and longer.
CREATE TABLE IF NOT EXISTS "outbox_events_rollup" (
    span            smallint     NOT NULL,
    minute          bigint       NOT NULL,
    event_type      varchar(255) NOT NULL,
    published       bigint       NOT NULL DEFAULT 0,
    delivered       bigint       NOT NULL DEFAULT 0,
    d0              bigint       NOT NULL DEFAULT 0,
    d1              bigint       NOT NULL DEFAULT 0,
    d2              bigint       NOT NULL DEFAULT 0,
    d3              bigint       NOT NULL DEFAULT 0,
    d4              bigint       NOT NULL DEFAULT 0,
    d5              bigint       NOT NULL DEFAULT 0,
    d6              bigint       NOT NULL DEFAULT 0,
    d7              bigint       NOT NULL DEFAULT 0,
    d8              bigint       NOT NULL DEFAULT 0,
    d9              bigint       NOT NULL DEFAULT 0,
    d10             bigint       NOT NULL DEFAULT 0,
    d11             bigint       NOT NULL DEFAULT 0,
    d12             bigint       NOT NULL DEFAULT 0,
    d13             bigint       NOT NULL DEFAULT 0,
    d14             bigint       NOT NULL DEFAULT 0,
    d15             bigint       NOT NULL DEFAULT 0,
    d16             bigint       NOT NULL DEFAULT 0,
    d17             bigint       NOT NULL DEFAULT 0,
    PRIMARY KEY (span, minute, event_type)
);

-- One row: the rows sent before rolled_until are in the rollup; below
-- low_seq no row is pending except those in the retry index (so the
-- overview counts the pending rows without a pending index).
CREATE TABLE IF NOT EXISTS "outbox_events_rollup_state" (
    id              smallint     PRIMARY KEY,
    rolled_until    timestamptz  NOT NULL,
    low_seq         bigint       NOT NULL,
    low_checked     timestamptz  NOT NULL
);

-- The failed rows by when they failed, for the overview's counts. Rows
-- enter it only when they fail, so business inserts do not pay for it.
-- db.Use builds it on a table that lacks it with a plain CREATE INDEX,
-- which holds writers for about a second per million rows: build it
-- beforehand with CREATE INDEX CONCURRENTLY to avoid that.
CREATE INDEX IF NOT EXISTS "outbox_events_failed_idx"
    ON "outbox_events" (updated_at) WHERE status = 'failed';

-- Each event's failed attempts and replays (outbox.Outbox.History, the
-- dashboard's event page): written only when a delivery fails or an
-- operator replays, never by Publish or a delivery that succeeds; deleted
-- by age with the sent rows (Config.RetainSent) and with a purged row.
-- outcome is retry (failed, to be tried again), failed (gave up) or
-- replayed (error is then the error the replay cleared the way past).
CREATE TABLE IF NOT EXISTS "outbox_events_attempts" (
    seq             bigint       NOT NULL,
    at              timestamptz  NOT NULL,
    attempt         integer      NOT NULL,
    outcome         varchar(16)  NOT NULL,
    error           text,
    actor           varchar(255),
    PRIMARY KEY (seq, at)
);
CREATE INDEX IF NOT EXISTS "outbox_events_attempts_at_idx"
    ON "outbox_events_attempts" (at);
-- The relays that serve this table (outbox.Stats' Relays, outbox stats
-- --min-relays, the dashboard's relays panel): each relay writes its row
-- every few seconds while it runs, with when it last claimed and delivered
-- events and its last error; the rows of relays not seen for a day are
-- deleted by the others. Never on the write path.
CREATE TABLE IF NOT EXISTS "outbox_events_relays" (
    id               varchar(64)  PRIMARY KEY,
    name             varchar(255) NOT NULL,
    host             varchar(255) NOT NULL,
    pid              integer      NOT NULL,
    mode             varchar(16)  NOT NULL,
    started_at       timestamptz  NOT NULL,
    seen_at          timestamptz  NOT NULL,
    last_claim_at    timestamptz,
    last_delivery_at timestamptz,
    last_error       text
);
COMMIT;
