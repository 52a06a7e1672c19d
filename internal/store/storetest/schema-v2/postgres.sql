-- The outbox table for PostgreSQL (schema version 2), as db.Use creates it
-- unless Config.DisableAutoMigrate is set. For another table name, replace
-- every outbox_events (outbox.SchemaSQL does this for you); a table created
-- by version 1 is upgraded by db.Use, or by the statements of
-- schema/postgres-upgrade-2.sql (outbox.UpgradeSQL). Identifiers are quoted
-- so that any name Config.Table accepts works, keywords and capitals
-- included.
CREATE TABLE IF NOT EXISTS "outbox_events" (
    id              varchar(255) NOT NULL PRIMARY KEY,
    -- Assigned by the database in write order: per-aggregate delivery
    -- follows it, not the writers' clocks.
    seq             bigint       GENERATED ALWAYS AS IDENTITY,
    event_type      varchar(255) NOT NULL,
    aggregate_type  varchar(255) NOT NULL DEFAULT '',
    aggregate_id    varchar(255) NOT NULL DEFAULT '',
    idempotency_key varchar(255) NOT NULL,
    payload         jsonb        NOT NULL,
    headers         jsonb,
    status          varchar(16)  NOT NULL DEFAULT 'pending',
    attempts        integer      NOT NULL DEFAULT 0,
    last_error      text,
    available_at    timestamptz  NOT NULL,
    locked_until    timestamptz,
    occurred_at     timestamptz  NOT NULL,
    created_at      timestamptz  NOT NULL,
    updated_at      timestamptz  NOT NULL,
    sent_at         timestamptz,
    CONSTRAINT "outbox_events_status_check" CHECK (status IN ('pending', 'sent', 'failed'))
);

-- The first write wins on the idempotency key. By default the key is the
-- event's ID, which the primary key already makes unique: only events with
-- a key of their own enter this index, so a default event pays for one
-- unique index, not two.
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
