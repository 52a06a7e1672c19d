package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Overview is what an operator looks at first: the counts now, and the
// window's published, delivered and failed events per interval.
func ExampleOutbox_Overview() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(context.Context, outbox.Event) error { return nil })
	ob.Handle("order.paid", func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("card declined")) })
	if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"}, outbox.Event{Type: "order.created"}, outbox.Event{Type: "order.paid"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	ov, err := ob.Overview(db, outbox.OverviewParams{Window: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending", ov.Pending, "failed", ov.Failed, "intervals", len(ov.Intervals), "of", ov.Step)
	fmt.Println("published", ov.Published, "delivered", ov.Delivered, "failed in the window", ov.FailedInWindow)
	for _, t := range ov.Types {
		fmt.Printf("%s: published %d, delivered %d, failed %d\n", t.Type, t.Published, t.Delivered, t.Failed)
	}
	// Output:
	// pending 0 failed 1 intervals 61 of 1m0s
	// published 3 delivered 2 failed in the window 1
	// order.created: published 2, delivered 2, failed 0
	// order.paid: published 1, delivered 0, failed 1
}

// History lists an event's failed attempts and the operators' actions on
// it; WithActor names who acted.
func ExampleOutbox_History() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	down := true
	ob.Handle("webhook.sent", func(context.Context, outbox.Event) error {
		if down {
			return outbox.Permanent(errors.New("410 Gone"))
		}
		return nil
	})
	if err := outbox.PublishAlone(db, outbox.Event{ID: "wh-1", Type: "webhook.sent"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	down = false
	ctx := outbox.WithActor(context.Background(), "alice@ops")
	if _, err := ob.Replay(db.WithContext(ctx), outbox.Filter{IDs: []string{"wh-1"}}); err != nil {
		log.Fatal(err)
	}
	h, err := ob.History(db, "wh-1")
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range h {
		fmt.Printf("%d %s %q %q\n", e.Attempt, e.Outcome, e.Error, e.Actor)
	}
	// Output:
	// 1 failed "410 Gone (permanent)" ""
	// 0 replayed "410 Gone (permanent)" "alice@ops"
}

// WithActor names who acts, for the history entries of Replay and
// RetryNow.
func ExampleWithActor() {
	ctx := outbox.WithActor(context.Background(), "oncall@example.com")
	fmt.Println(ctx != nil)
	// Output: true
}

// RetryNow makes the events waiting for a retry due at once: once a
// receiver that failed is fixed, its events need not wait out their
// backoff.
func ExampleOutbox_RetryNow() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	fixed := false
	ob.Handle("invoice.sent", func(context.Context, outbox.Event) error {
		if !fixed {
			return outbox.RetryAfter(errors.New("503 from the mailer"), time.Hour)
		}
		return nil
	})
	if err := outbox.PublishAlone(db, outbox.Event{Type: "invoice.sent"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	fixed = true
	n, err := ob.RetryNow(db, outbox.Filter{Types: []string{"invoice.sent"}})
	fmt.Println("retried", n, err)
	n, err = relay.ProcessOnce(context.Background())
	fmt.Println("delivered", n, err)
	// Output:
	// retried 1 <nil>
	// delivered 1 <nil>
}

// IDColumn reads an event's ID in SQL of your own.
func ExampleOutbox_IDColumn() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	if err := outbox.PublishAlone(db, outbox.Event{ID: "ord-7", Type: "order.created", IdempotencyKey: "order:7"}); err != nil {
		log.Fatal(err)
	}
	var id string
	err := db.Raw("SELECT "+ob.IDColumn()+" FROM "+ob.Table()+" WHERE idempotency_key = ?", "order:7").Scan(&id).Error
	fmt.Println(id, err)
	// Output: ord-7 <nil>
}

// CheckInboxID tells a message whose ID the inbox can never record (to
// terminate, not to retry) from an error of the consumer's own.
func ExampleCheckInboxID() {
	fmt.Println(outbox.CheckInboxID("evt-0192"))
	err := outbox.CheckInboxID(strings.Repeat("x", outbox.MaxInboxIDLen+1))
	fmt.Println(errors.Is(err, outbox.ErrInvalidInboxID))
	// Output:
	// <nil>
	// true
}

// InboxSchemaSQL gives the inbox table's DDL under another name
// (Config.InboxTable), for teams that run their own migrations.
func ExampleInboxSchemaSQL() {
	ddl, err := outbox.InboxSchemaSQL("postgres", "billing_inbox")
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.Lines(ddl) {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Print(line)
		}
	}
	// Output:
	// CREATE TABLE IF NOT EXISTS "billing_inbox" (
	// CREATE INDEX IF NOT EXISTS "billing_inbox_consumed_idx"
}

// UpgradeSQLFrom gives the scripts from an older schema version on, one
// transaction each, in the order to run them; "" where the database never
// had that version.
func ExampleUpgradeSQLFrom() {
	for _, dialect := range []string{"postgres", "mysql"} {
		sql, err := outbox.UpgradeSQLFrom(dialect, outbox.DefaultTable, 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s from version 1: %d transactions\n", dialect, strings.Count(sql, "COMMIT;"))
	}
	// Output:
	// postgres from version 1: 2 transactions
	// mysql from version 1: 0 transactions
}
