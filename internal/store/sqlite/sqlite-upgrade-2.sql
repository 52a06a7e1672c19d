-- Upgrades an outbox table of schema version 1 to version 2 on SQLite, in
-- one transaction: SQLite cannot change a primary key in place, so the rows
-- move to a new table, numbered in the order version 1 delivered them.
-- db.Use runs it when it finds a version 1 table (unless
-- Config.DisableAutoMigrate is set). For another table name, replace every
-- outbox_events (outbox.UpgradeSQL does this for you).
BEGIN IMMEDIATE;
CREATE TABLE "outbox_events__v2" (
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
INSERT INTO "outbox_events__v2" (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers,
        status, attempts, last_error, available_at, locked_until, occurred_at, created_at, updated_at, sent_at)
    SELECT id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers,
        status, attempts, last_error, available_at, locked_until, occurred_at, created_at, updated_at, sent_at
    FROM "outbox_events" ORDER BY created_at, id;
DROP TABLE "outbox_events";
ALTER TABLE "outbox_events__v2" RENAME TO "outbox_events";
CREATE UNIQUE INDEX "outbox_events_idempotency_key_idx"
    ON "outbox_events" (idempotency_key) WHERE idempotency_key <> id;
CREATE INDEX "outbox_events_pending_idx"
    ON "outbox_events" (available_at, seq) WHERE status = 'pending';
CREATE INDEX "outbox_events_sent_idx"
    ON "outbox_events" (sent_at) WHERE status = 'sent';
COMMIT;
