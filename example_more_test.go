package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// Plugin only describes the outbox; db.Use installs it, checking the
// configuration and creating the table, so a bad setting fails at startup
// rather than at the first Publish.
func ExamplePlugin() {
	db, done := openDB()
	defer done()

	err := db.Use(outbox.Plugin(outbox.Config{Table: "order events", Logger: quiet}))
	fmt.Println("invalid table name refused:", errors.Is(err, outbox.ErrInvalidConfig))

	ob := outbox.Plugin(outbox.Config{Table: "shop_outbox", Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	fmt.Println(ob.Name(), ob.Mode(), ob.Table(), db.Migrator().HasTable(ob.Table()))
	// Output:
	// invalid table name refused: true
	// outbox persistent shop_outbox true
}

// Memory mode keeps no table and needs no relay: handlers run right after
// the outermost commit, in the committing goroutine, and never after a
// rollback. It suits development and tests; events are lost if the process
// dies before the commit returns.
func ExamplePlugin_memory() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Mode: outbox.Memory, Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		var p OrderCreated
		if err := e.DecodePayload(&p); err != nil {
			return err
		}
		fmt.Printf("handled order %d (attempt %d)\n", p.ID, outbox.Attempt(ctx))
		return nil
	})

	err := db.Transaction(func(tx *gorm.DB) error {
		order := Order{Total: 42}
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		fmt.Println("publishing")
		return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: OrderCreated{ID: order.ID, Total: order.Total}})
	})
	fmt.Println("committed:", err)
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: OrderCreated{ID: 99}}); err != nil {
			return err
		}
		return errors.New("out of stock")
	})
	fmt.Println("rolled back:", err)

	_, err = ob.Relay(db, outbox.RelayConfig{})
	fmt.Println("no relay in memory mode:", errors.Is(err, outbox.ErrMemoryMode))
	fmt.Println("no table:", !db.Migrator().HasTable(outbox.DefaultTable))
	// Output:
	// publishing
	// handled order 1 (attempt 0)
	// committed: <nil>
	// rolled back: out of stock
	// no relay in memory mode: true
	// no table: true
}

// Modes print as the words the logs and the outbox command use.
func ExampleMode_String() {
	fmt.Println(outbox.Persistent, outbox.Memory, outbox.Logical)
	// Output: persistent memory logical
}

// Handlers are registered per event type; those registered for AnyEvent
// see every event, which suits an audit log or a catch-all forwarder.
// An event's handlers run in registration order.
func ExampleOutbox_Handle() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		fmt.Println("mailer:", e.Type, e.AggregateID)
		return nil
	})
	ob.Handle(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) error {
		fmt.Println("audit: ", e.Type, e.AggregateID)
		return nil
	})

	err := db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx,
			outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: "1"},
			outbox.Event{Type: "order.paid", AggregateType: "order", AggregateID: "1"},
		)
	})
	if err != nil {
		log.Fatal(err)
	}
	// One worker delivers the batch in the order it was written.
	relay, err := ob.Relay(db, outbox.RelayConfig{Workers: 1})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// mailer: order.created 1
	// audit:  order.created 1
	// audit:  order.paid 1
}

// An AsyncHandler starts a delivery and returns a wait for its outcome: the
// relay starts every event of a batch before it waits for any, as a
// pipelined broker client publishes (here a channel stands for the
// broker's acknowledgements). The adapters' AsyncHandler methods return
// one: ob.HandleAsync(outbox.AnyEvent, pub.AsyncHandler()).
func ExampleOutbox_HandleAsync() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.HandleAsync("order.created", func(ctx context.Context, e outbox.Event) (wait func() error) {
		fmt.Println("publish", e.AggregateID)
		acked := make(chan error, 1)
		acked <- nil // the broker's acknowledgement, when it comes
		return func() error {
			select {
			case err := <-acked:
				fmt.Println("acked", e.AggregateID)
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})

	err := db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx,
			outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: "1"},
			outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: "2"},
			outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: "3"},
		)
	})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// publish 1
	// publish 2
	// publish 3
	// acked 1
	// acked 2
	// acked 3
}

// Relay checks its configuration when it is built: a refused configuration
// is an error and no relay. Retention is the table's setting, in Config.
func ExampleOutbox_Relay() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet, RetainSent: 24 * time.Hour})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error { return nil })

	bad, err := ob.Relay(db, outbox.RelayConfig{BatchSize: -1})
	fmt.Println("refused:", errors.Is(err, outbox.ErrInvalidConfig), bad == nil)

	relay, err := ob.Relay(db, outbox.RelayConfig{
		BatchSize:   50,
		MaxAttempts: 5,
		Lease:       30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"}); err != nil {
		log.Fatal(err)
	}
	n, err := relay.ProcessOnce(context.Background())
	fmt.Println("claimed", n, err)
	// Output:
	// refused: true true
	// claimed 1 <nil>
}

// ProcessOnce delivers one batch and returns how many events it claimed,
// which makes delivery deterministic in a test or a cron job: call it until
// it claims fewer than BatchSize.
func ExampleRelay_ProcessOnce() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	var delivered atomic.Int64 // the relay's workers run concurrently
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		delivered.Add(1)
		return nil
	})
	for i := range 5 {
		if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created", AggregateID: fmt.Sprint(i)}); err != nil {
			log.Fatal(err)
		}
	}

	const batch = 2
	relay, err := ob.Relay(db, outbox.RelayConfig{BatchSize: batch})
	if err != nil {
		log.Fatal(err)
	}
	for {
		n, err := relay.ProcessOnce(context.Background())
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("claimed", n)
		if n < batch {
			break
		}
	}
	fmt.Println("delivered", delivered.Load())
	// Output:
	// claimed 2
	// claimed 2
	// claimed 1
	// delivered 5
}

// With Config.DisableAutoMigrate, db.Use leaves the schema alone; a
// migration step (or a deploy job) then calls Migrate, which creates only
// what is missing and is safe to run on every start.
func ExampleOutbox_Migrate() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{DisableAutoMigrate: true, Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after db.Use:", db.Migrator().HasTable(ob.Table()))

	if err := ob.Migrate(db); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after Migrate:", db.Migrator().HasTable(ob.Table()))
	fmt.Println("again:", ob.Migrate(db))
	// Output:
	// after db.Use: false
	// after Migrate: true
	// again: <nil>
}

// Teams that run their own migrations get the DDL db.Use would run, for the
// table name they configure, and keep it in their migration files.
func ExampleSchemaSQL() {
	ddl, err := outbox.SchemaSQL("postgres", "shop_outbox")
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.Lines(ddl) {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Print(line)
		}
	}
	_, err = outbox.SchemaSQL("oracle", "shop_outbox")
	fmt.Println("oracle:", errors.Is(err, outbox.ErrUnsupportedDialect))
	// Output:
	// CREATE TYPE "shop_outbox_status" AS ENUM ('pending', 'sent', 'failed');
	// CREATE TABLE IF NOT EXISTS "shop_outbox" (
	// CREATE UNIQUE INDEX IF NOT EXISTS "shop_outbox_named_id_idx"
	// CREATE UNIQUE INDEX IF NOT EXISTS "shop_outbox_idempotency_key_idx"
	// CREATE INDEX IF NOT EXISTS "shop_outbox_retry_idx"
	// CREATE INDEX IF NOT EXISTS "shop_outbox_sent_idx"
	// CREATE TABLE IF NOT EXISTS "shop_outbox_rollup" (
	// CREATE TABLE IF NOT EXISTS "shop_outbox_rollup_state" (
	// CREATE INDEX IF NOT EXISTS "shop_outbox_failed_idx"
	// CREATE TABLE IF NOT EXISTS "shop_outbox_attempts" (
	// CREATE INDEX IF NOT EXISTS "shop_outbox_attempts_at_idx"
	// CREATE TABLE IF NOT EXISTS "shop_outbox_relays" (
	// CREATE TABLE IF NOT EXISTS "outbox_inbox" (
	// CREATE INDEX IF NOT EXISTS "outbox_inbox_consumed_idx"
	// oracle: true
}

// UpgradeSQL gives the statements that bring a table of an earlier schema
// version up to date, each dialect's in one transaction, followed by the
// inbox table version 3 brought, for a migration file; it is empty where
// there is nothing to upgrade.
func ExampleUpgradeSQL() {
	for _, dialect := range []string{"postgres", "sqlite", "mysql"} {
		sql, err := outbox.UpgradeSQL(dialect, outbox.DefaultTable)
		if err != nil {
			log.Fatal(err)
		}
		if sql == "" {
			fmt.Println(dialect+":", "nothing to upgrade")
			continue
		}
		var statements []string
		for line := range strings.Lines(sql) {
			if !strings.HasPrefix(line, "--") && !strings.HasPrefix(line, " ") {
				statements = append(statements, strings.TrimSpace(line))
			}
		}
		fmt.Println(dialect+":", statements[0], "...", statements[len(statements)-1])
	}
	// Output:
	// postgres: BEGIN; ... CREATE INDEX IF NOT EXISTS "outbox_inbox_consumed_idx"
	// sqlite: BEGIN IMMEDIATE; ... CREATE INDEX IF NOT EXISTS "outbox_inbox_consumed_idx"
	// mysql: SELECT GET_LOCK(CONCAT(DATABASE(), '.outbox_events.upgrade'), 60); ... ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
}

// SQLTx hands the transaction's *sql.Tx to code written for database/sql,
// so that its writes commit or roll back with the event.
func ExampleSQLTx() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}

	err := db.Transaction(func(tx *gorm.DB) error {
		stx, ok := outbox.SQLTx(tx)
		if !ok {
			return errors.New("not a database/sql transaction")
		}
		if _, err := stx.Exec(`INSERT INTO orders (total) VALUES (?)`, 42); err != nil {
			return err
		}
		return outbox.Publish(tx, outbox.Event{Type: "order.created"})
	})
	if err != nil {
		log.Fatal(err)
	}
	_, ok := outbox.SQLTx(db)
	fmt.Println("outside a transaction:", ok)

	var orders int64
	if err := db.Model(&Order{}).Count(&orders).Error; err != nil {
		log.Fatal(err)
	}
	events, err := ob.Count(db, outbox.Filter{})
	fmt.Println("orders", orders, "events", events, err)
	// Output:
	// outside a transaction: false
	// orders 1 events 1 <nil>
}

// Handlers receive the payload as JSON in every mode; DecodePayload reads
// it into the type the consumer expects.
func ExampleEvent_DecodePayload() {
	e := outbox.Event{Type: "order.created", Payload: json.RawMessage(`{"id":7,"total":42}`)}

	var p OrderCreated
	if err := e.DecodePayload(&p); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", p)
	// Output: {ID:7 Total:42}
}

// PayloadJSON shows the bytes Publish would store for an event built by
// hand: useful to log a payload's size or to check its encoding in a test.
func ExampleEvent_PayloadJSON() {
	e := outbox.Event{Type: "order.created", Payload: OrderCreated{ID: 7, Total: 42}}

	b, err := e.PayloadJSON()
	fmt.Println(string(b), err)
	// Output: {"id":7,"total":42} <nil>
}

// An event stays recorded on its entity until a transaction that saved it
// commits: after a rollback, saving the entity again publishes it once, with
// the same ID.
func ExampleRecorder_Recorded() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}

	order := Order{ID: 7, Total: 10}
	order.Record(outbox.Event{Type: "order.created"})
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return errors.New("payment declined")
	})
	fmt.Println(err, "- still recorded:", len(order.Recorded()))

	if err := db.Create(&order).Error; err != nil {
		log.Fatal(err)
	}
	n, err := ob.Count(db, outbox.Filter{Types: []string{"order.created"}})
	fmt.Println("after commit:", len(order.Recorded()), "recorded,", n, "in the table", err)
	// Output:
	// payment declined - still recorded: 1
	// after commit: 0 recorded, 1 in the table <nil>
}

// The idempotency key makes publishing a no-op the second time, across
// transactions: a retried request or a redelivered command publishes its
// event once.
func ExamplePublish_idempotencyKey() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}

	for range 2 {
		err := db.Transaction(func(tx *gorm.DB) error {
			return outbox.Publish(tx, outbox.Event{Type: "order.paid", IdempotencyKey: "payment-pi_123"})
		})
		fmt.Println("published:", err)
	}
	n, err := ob.Count(db, outbox.Filter{Types: []string{"order.paid"}})
	fmt.Println("rows:", n, err)
	// Output:
	// published: <nil>
	// published: <nil>
	// rows: 1 <nil>
}

// Publish refuses before touching the database: an invalid event, or a
// *gorm.DB the plugin is not installed on. Returned from the transaction
// function, the error rolls the business writes back.
func ExamplePublish_errors() {
	db, done := openDB()
	defer done()

	err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"})
	fmt.Println("not installed:", errors.Is(err, outbox.ErrNotInstalled))

	if err := db.Use(outbox.Plugin(outbox.Config{Logger: quiet})); err != nil {
		log.Fatal(err)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Total: 5}).Error; err != nil {
			return err
		}
		return outbox.Publish(tx, outbox.Event{Payload: "no type"})
	})
	fmt.Println("invalid event:", errors.Is(err, outbox.ErrInvalidEvent))
	var orders int64
	db.Model(&Order{}).Count(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// not installed: true
	// invalid event: true
	// orders: 0
}

// Row maps the outbox table for GORM queries of your own, such as a report
// the operating functions (List, Count) do not cover.
func ExampleRow() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	err := outbox.PublishAlone(db,
		outbox.Event{ID: "e1", Type: "order.created", AggregateType: "order", AggregateID: "1"},
		outbox.Event{ID: "e2", Type: "order.paid", AggregateType: "order", AggregateID: "1"},
	)
	if err != nil {
		log.Fatal(err)
	}

	var rows []outbox.Row
	err = db.Table(ob.Table()).
		Where("aggregate_type = ? AND aggregate_id = ?", "order", "1").
		Order("seq").Find(&rows).Error
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rows {
		fmt.Println(r.Seq, r.ID, r.EventType, r.Status, r.Attempts)
	}
	// Output:
	// 1 e1 order.created pending 0
	// 2 e2 order.paid pending 0
}
