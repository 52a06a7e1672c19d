-- Upgrades an outbox table of schema version 2 to version 3 on SQLite, in
-- one transaction: SQLite cannot change a column in place, so the rows move
-- to a new table, keeping their seq. db.Use runs it when it finds a version
-- 2 table (unless Config.DisableAutoMigrate is set; a version 1 table gets
-- sqlite-upgrade-2.sql first). For another table name, replace every
-- outbox_events (outbox.UpgradeSQL does this for you).
BEGIN IMMEDIATE;
CREATE TABLE "outbox_events__v3" (
    seq             INTEGER  PRIMARY KEY AUTOINCREMENT,
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
-- Version 2 did not record which IDs a publisher chose: every existing ID
-- counts as chosen, so each stays unique.
INSERT INTO "outbox_events__v3" (seq, id, named_id, event_type, aggregate_type, aggregate_id, idempotency_key,
        payload, headers, status, attempts, last_error, available_at, locked_until, occurred_at, created_at, updated_at, sent_at)
    SELECT seq, id, id, event_type, aggregate_type, aggregate_id, NULLIF(idempotency_key, id),
        payload, headers, status, attempts, last_error, available_at, locked_until, occurred_at, created_at, updated_at, sent_at
    FROM "outbox_events" ORDER BY seq;
DROP TABLE "outbox_events";
ALTER TABLE "outbox_events__v3" RENAME TO "outbox_events";
CREATE UNIQUE INDEX "outbox_events_named_id_idx"
    ON "outbox_events" (named_id) WHERE named_id IS NOT NULL;
CREATE UNIQUE INDEX "outbox_events_idempotency_key_idx"
    ON "outbox_events" (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX "outbox_events_retry_idx"
    ON "outbox_events" (available_at) WHERE status = 'pending' AND available_at IS NOT NULL;
CREATE INDEX "outbox_events_sent_idx"
    ON "outbox_events" (sent_at) WHERE status = 'sent';
COMMIT;
