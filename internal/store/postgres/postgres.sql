-- The outbox table for PostgreSQL (schema version 3), as db.Use creates it
-- unless Config.DisableAutoMigrate is set. For another table name, replace
-- every outbox_events (outbox.SchemaSQL does this for you); a table created
-- by an earlier version is upgraded by db.Use, or by the statements of
-- schema/postgres-upgrade-<version>.sql (outbox.UpgradeSQL). Identifiers are
-- quoted so that any name Config.Table accepts works, keywords and capitals
-- included.
--
-- The row is lean: an event whose ID and key the outbox generated writes one
-- index entry (the primary key) and leaves NULL every column whose value
-- another column gives (outbox.List, Get and the outbox command show the
-- value): idempotency_key NULL is the event's ID, available_at NULL is due
-- at once, created_at NULL is occurred_at, updated_at NULL is created_at.

-- The status reads as the words pending, sent and failed, in 4 bytes.
CREATE TYPE "outbox_events_status" AS ENUM ('pending', 'sent', 'failed');

-- A page is filled half by INSERTs: the other half takes the claim's new
-- row versions, so a claim, which changes no indexed column, is a HOT
-- update (no new index entry, the primary key's included). A relay then
-- drains a backlog about a fifth faster, 4 relays about a quarter
-- (BENCHMARKS.md, "HOT claims"). A table created before this line was
-- added takes it with ALTER TABLE "outbox_events" SET (fillfactor = 50),
-- for the pages written after it.
CREATE TABLE IF NOT EXISTS "outbox_events" (
    -- Assigned by the database in write order: per-aggregate delivery
    -- follows it, not the writers' clocks, and the relay reads new events
    -- by it, from a low watermark it keeps.
    seq             bigint       GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The event's ID as a native UUID. An ID the publisher chose is in
    -- named_id, and here as a UUID derived from it (itself, when it is one).
    id              uuid         NOT NULL,
    named_id        varchar(255),
    event_type      varchar(255) NOT NULL,
    aggregate_type  varchar(255) NOT NULL DEFAULT '',
    aggregate_id    varchar(255) NOT NULL DEFAULT '',
    idempotency_key varchar(255),
    payload         jsonb        NOT NULL,
    headers         jsonb,
    status          "outbox_events_status" NOT NULL DEFAULT 'pending',
    attempts        integer      NOT NULL DEFAULT 0,
    last_error      text,
    available_at    timestamptz,
    locked_until    timestamptz,
    occurred_at     timestamptz  NOT NULL,
    created_at      timestamptz,
    updated_at      timestamptz,
    sent_at         timestamptz
) WITH (fillfactor = 50);

-- The first write wins on an ID or a key the publisher chose: only such
-- events enter these indexes. A generated ID (a fresh UUIDv7) cannot repeat.
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_events_named_id_idx"
    ON "outbox_events" (named_id) WHERE named_id IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_events_idempotency_key_idx"
    ON "outbox_events" (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Events that wait for a retry (or were replayed, or handed back): the claim
-- finds them here when due. A new event is due at once (available_at NULL)
-- and does not enter it; the relay finds new events by seq.
CREATE INDEX IF NOT EXISTS "outbox_events_retry_idx"
    ON "outbox_events" (available_at) WHERE status = 'pending' AND available_at IS NOT NULL;

-- Retention deletes sent rows by age in small batches. Rows enter this index
-- only when the relay marks them sent, so business inserts do not pay for it.
CREATE INDEX IF NOT EXISTS "outbox_events_sent_idx"
    ON "outbox_events" (sent_at) WHERE status = 'sent';

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
