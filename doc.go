// Package outbox is a GORM plugin for the transactional outbox pattern: an
// event is written in the same database transaction as the business data it
// describes, and delivered after that transaction commits, at least once.
//
// # Installing
//
//	ob := outbox.Plugin(outbox.Config{}) // persistent mode, table outbox_events
//	if err := db.Use(ob); err != nil {   // creates the table if missing
//		return err
//	}
//	ob.Handle("order.created", sendWelcomeMail)
//
// Install the plugin before creating sessions from db, and before plugins
// that wrap the connection pool (dbresolver).
//
// # Publishing in a transaction
//
// [Publish] attaches events to the transaction a *gorm.DB runs in:
//
//	err := db.Transaction(func(tx *gorm.DB) error {
//		if err := tx.Create(&order).Error; err != nil {
//			return err
//		}
//		return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: order})
//	})
//
// In persistent mode the event row is INSERTed on tx: invisible until tx
// commits, gone if it rolls back. A model that embeds [Recorder] can record
// events on itself instead; the plugin publishes them when the model is
// created, updated, saved or deleted. [AfterCommit] is the general hook:
// run a function after the outermost commit, never on rollback.
//
// # The relay
//
// In persistent mode a [Relay] delivers committed events:
//
//	relay, err := ob.Relay(db, outbox.RelayConfig{}) // an invalid configuration is an error here
//	if err != nil {
//		return err
//	}
//	go func() { errc <- relay.Run(ctx) }()
//
// It claims due rows with a lease (FOR UPDATE SKIP LOCKED on PostgreSQL and
// MySQL), so
// any number of relays can share one table without delivering an event twice
// while its claim is live. It calls the handlers outside any transaction,
// marks delivered rows sent, retries failures with backoff, and marks an
// event failed after RelayConfig.MaxAttempts; [Outbox.Replay] retries it.
// Delivery is at least once: handlers must be idempotent or deduplicate by
// [Event.ID].
//
// # Memory mode
//
// Config{Mode: outbox.Memory} keeps no table. Events are handed to the
// handlers synchronously, in the committing goroutine, right after the
// outermost commit, and are lost if the process dies first: meant for
// development on SQLite and for tests. Handlers see the same [Event] in both
// modes, payload as json.RawMessage.
//
// # Logical mode
//
// Config{Mode: outbox.Logical}, on PostgreSQL 14+ with wal_level=logical,
// carries events in the WAL instead of the table: [Publish] emits them as a
// logical decoding message (failing with [ErrNoSlot] rather than emitting
// while the replication slot is missing), and the relay streams the slot in
// commit order. Only failed or held-back events are written to the table,
// and retried from there as in persistent mode.
//
// # Tracing and metrics
//
// The module github.com/gorm-outbox/outbox/outboxotel adds OpenTelemetry
// traces and metrics in one line (outboxotel.Instrument(ob)): trace context
// stored with each event at [Publish] and continued by every delivery and
// the messages the adapters send. It is built on [Hooks], which other
// instrumentation can use through [Outbox.AddHooks]; the core imports no
// instrumentation library.
//
// # Testing
//
// Use memory mode, or persistent mode with [Relay.ProcessOnce] to deliver
// deterministically from a test. Package outboxtest wraps the usual steps: a
// SQLite outbox in a temporary file, publishing, draining a relay, reading a
// row back.
package outbox
