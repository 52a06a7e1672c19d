-- The outbox table for SQLite (schema version 2), as db.Use creates it
-- unless Config.DisableAutoMigrate is set. For another table name, replace
-- every outbox_events (outbox.SchemaSQL does this for you); a table created
-- by version 1 is upgraded by db.Use, or by the statements of
-- schema/sqlite-upgrade-2.sql (outbox.UpgradeSQL). Identifiers are quoted
-- so that any name Config.Table accepts works, keywords and capitals
-- included.
-- Times are written by the library as UTC text in one format, so that
-- comparing them as strings orders them correctly.
CREATE TABLE IF NOT EXISTS "outbox_events" (
    -- The rowid, assigned in write order: per-aggregate delivery follows it,
    -- not the writers' clocks.
    seq             INTEGER  PRIMARY KEY,
    id              TEXT     NOT NULL,
    event_type      TEXT     NOT NULL,
    aggregate_type  TEXT     NOT NULL DEFAULT '',
    aggregate_id    TEXT     NOT NULL DEFAULT '',
    idempotency_key TEXT     NOT NULL,
    payload         TEXT     NOT NULL,
    headers         TEXT,
    status          TEXT     NOT NULL DEFAULT 'pending',
    attempts        INTEGER  NOT NULL DEFAULT 0,
    last_error      TEXT,
    available_at    DATETIME NOT NULL,
    locked_until    DATETIME,
    occurred_at     DATETIME NOT NULL,
    created_at      DATETIME NOT NULL,
    updated_at      DATETIME NOT NULL,
    sent_at         DATETIME,
    CONSTRAINT "outbox_events_id_key" UNIQUE (id),
    CONSTRAINT "outbox_events_status_check" CHECK (status IN ('pending', 'sent', 'failed'))
);

-- The first write wins on the idempotency key. By default the key is the
-- event's ID, already unique: only events with a key of their own enter
-- this index, so a default event pays for one unique index, not two.
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_events_idempotency_key_idx"
    ON "outbox_events" (idempotency_key) WHERE idempotency_key <> id;

-- The relay's claim reads only due pending rows, oldest first. A partial index
-- keeps that cost independent of how many sent rows the table holds.
CREATE INDEX IF NOT EXISTS "outbox_events_pending_idx"
    ON "outbox_events" (available_at, seq) WHERE status = 'pending';

-- Retention deletes sent rows by age in small batches. Rows enter this index
-- only when the relay marks them sent, so business inserts do not pay for it.
CREATE INDEX IF NOT EXISTS "outbox_events_sent_idx"
    ON "outbox_events" (sent_at) WHERE status = 'sent';
