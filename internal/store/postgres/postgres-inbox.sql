-- The inbox table for PostgreSQL, as db.Use creates it unless
-- Config.DisableAutoMigrate is set: the messages each consumer has consumed
-- (outbox.Consume records the pair in the transaction of its effect). For
-- another name, replace every outbox_inbox (outbox.InboxSchemaSQL does this
-- for you).
CREATE TABLE IF NOT EXISTS "outbox_inbox" (
    consumer    varchar(255) NOT NULL,
    message_id  varchar(255) NOT NULL,
    consumed_at timestamptz  NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Retention deletes the pairs consumed before its window, oldest first, in
-- small batches.
CREATE INDEX IF NOT EXISTS "outbox_inbox_consumed_idx"
    ON "outbox_inbox" (consumed_at);
