-- The outbox table for SQLite (schema version 3), as db.Use creates it
-- unless Config.DisableAutoMigrate is set. For another table name, replace
-- every outbox_events (outbox.SchemaSQL does this for you); a table created
-- by an earlier version is upgraded by db.Use, or by the statements of
-- schema/sqlite-upgrade-<version>.sql (outbox.UpgradeSQL). Identifiers are
-- quoted so that any name Config.Table accepts works, keywords and capitals
-- included.
-- Times are written by the library as UTC text in one format, so that
-- comparing them as strings orders them correctly.
--
-- The row is lean: an event whose ID and key the outbox generated writes one
-- index entry (the rowid) and leaves NULL every column whose value another
-- column gives (outbox.List, Get and the outbox command show the value):
-- idempotency_key NULL is the event's ID, available_at NULL is due at once,
-- created_at NULL is occurred_at, updated_at NULL is created_at.
CREATE TABLE IF NOT EXISTS "outbox_events" (
    -- The rowid, assigned in write order: per-aggregate delivery follows it,
    -- not the writers' clocks, and the relay reads new events by it, from a
    -- low watermark it keeps. AUTOINCREMENT: a seq is never given out twice,
    -- even once the rows at the top were deleted, so none lands below the
    -- watermark.
    seq             INTEGER  PRIMARY KEY AUTOINCREMENT,
    -- The event's ID. An ID the publisher chose is in named_id too, which
    -- only such events fill.
    id              TEXT     NOT NULL,
    named_id        TEXT,
    event_type      TEXT     NOT NULL,
    aggregate_type  TEXT     NOT NULL DEFAULT '',
    aggregate_id    TEXT     NOT NULL DEFAULT '',
    idempotency_key TEXT,
    payload         TEXT     NOT NULL,
    headers         TEXT,
    status          TEXT     NOT NULL DEFAULT 'pending',
    attempts        INTEGER  NOT NULL DEFAULT 0,
    last_error      TEXT,
    available_at    DATETIME,
    locked_until    DATETIME,
    occurred_at     DATETIME NOT NULL,
    created_at      DATETIME,
    updated_at      DATETIME,
    sent_at         DATETIME,
    CONSTRAINT "outbox_events_status_check" CHECK (status IN ('pending', 'sent', 'failed'))
);

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
    span            INTEGER      NOT NULL,
    minute          INTEGER      NOT NULL,
    event_type      TEXT         NOT NULL,
    published       INTEGER      NOT NULL DEFAULT 0,
    delivered       INTEGER      NOT NULL DEFAULT 0,
    d0              INTEGER      NOT NULL DEFAULT 0,
    d1              INTEGER      NOT NULL DEFAULT 0,
    d2              INTEGER      NOT NULL DEFAULT 0,
    d3              INTEGER      NOT NULL DEFAULT 0,
    d4              INTEGER      NOT NULL DEFAULT 0,
    d5              INTEGER      NOT NULL DEFAULT 0,
    d6              INTEGER      NOT NULL DEFAULT 0,
    d7              INTEGER      NOT NULL DEFAULT 0,
    d8              INTEGER      NOT NULL DEFAULT 0,
    d9              INTEGER      NOT NULL DEFAULT 0,
    d10             INTEGER      NOT NULL DEFAULT 0,
    d11             INTEGER      NOT NULL DEFAULT 0,
    d12             INTEGER      NOT NULL DEFAULT 0,
    d13             INTEGER      NOT NULL DEFAULT 0,
    d14             INTEGER      NOT NULL DEFAULT 0,
    d15             INTEGER      NOT NULL DEFAULT 0,
    d16             INTEGER      NOT NULL DEFAULT 0,
    d17             INTEGER      NOT NULL DEFAULT 0,
    PRIMARY KEY (span, minute, event_type)
);

-- One row: the rows sent before rolled_until are in the rollup; below
-- low_seq no row is pending except those in the retry index (so the
-- overview counts the pending rows without a pending index).
CREATE TABLE IF NOT EXISTS "outbox_events_rollup_state" (
    id              INTEGER      PRIMARY KEY,
    rolled_until    DATETIME     NOT NULL,
    low_seq         INTEGER      NOT NULL,
    low_checked     DATETIME     NOT NULL
);

-- The failed rows by when they failed, for the overview's counts. Rows
-- enter it only when they fail, so business inserts do not pay for it.
CREATE INDEX IF NOT EXISTS "outbox_events_failed_idx"
    ON "outbox_events" (updated_at) WHERE status = 'failed';

-- Each event's failed attempts and replays (outbox.Outbox.History, the
-- dashboard's event page): written only when a delivery fails or an
-- operator replays, never by Publish or a delivery that succeeds; deleted
-- by age with the sent rows (Config.RetainSent) and with a purged row.
-- outcome is retry (failed, to be tried again), failed (gave up) or
-- replayed (error is then the error the replay cleared the way past).
CREATE TABLE IF NOT EXISTS "outbox_events_attempts" (
    seq             INTEGER      NOT NULL,
    at              DATETIME     NOT NULL,
    attempt         INTEGER      NOT NULL,
    outcome         TEXT         NOT NULL,
    error           TEXT,
    actor           TEXT,
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
    id               TEXT         PRIMARY KEY,
    name             TEXT         NOT NULL,
    host             TEXT         NOT NULL,
    pid              INTEGER      NOT NULL,
    mode             TEXT         NOT NULL,
    started_at       DATETIME     NOT NULL,
    seen_at          DATETIME     NOT NULL,
    last_claim_at    DATETIME,
    last_delivery_at DATETIME,
    last_error       TEXT
);
