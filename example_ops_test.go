package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/gorm-outbox/outbox"
)

// List pages through the table by Seq, the order rows were written, so a
// page boundary stays put while new events arrive: pass the last row's Seq
// as AfterSeq (oldest first) or BeforeSeq (newest first).
func ExampleOutbox_List() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"e1", "e2", "e3", "e4", "e5"} {
		if err := outbox.PublishAlone(db, outbox.Event{ID: id, Type: "order.created"}); err != nil {
			log.Fatal(err)
		}
	}

	p := outbox.ListParams{Filter: outbox.Filter{Types: []string{"order.created"}}, Limit: 2}
	for page := 1; ; page++ {
		rows, err := ob.List(db, p)
		if err != nil {
			log.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		fmt.Print("page ", page, ":")
		for _, r := range rows {
			fmt.Print(" ", r.ID)
		}
		fmt.Println()
		p.AfterSeq = rows[len(rows)-1].Seq
	}

	newest, err := ob.List(db, outbox.ListParams{Newest: true, Limit: 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("newest:", newest[0].ID, newest[1].ID)
	// Output:
	// page 1: e1 e2
	// page 2: e3 e4
	// page 3: e5
	// newest: e5 e4
}

// Get reads one event's row: its status, attempts and last error, the first
// thing to look at when a consumer says an event never arrived. Here no
// handler is registered for the type, so the relay keeps retrying it.
func ExampleOutbox_Get() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	if err := outbox.PublishAlone(db, outbox.Event{ID: "ship-1", Type: "order.shipped"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}

	r, err := ob.Get(db, "ship-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.EventType, r.Status, r.Attempts)
	fmt.Println(*r.LastError)

	_, err = ob.Get(db, "ship-2")
	fmt.Println("ship-2 not found:", errors.Is(err, outbox.ErrNotFound))
	// Output:
	// order.shipped pending 1
	// outbox: no handler registered for event type "order.shipped"
	// ship-2 not found: true
}

// Count is the dry run of Replay and Purge: how many rows a filter would
// touch, to show an operator before acting.
func ExampleOutbox_Count() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("invoice.issued", func(ctx context.Context, e outbox.Event) error {
		if e.AggregateID == "acme" {
			return outbox.Permanent(errors.New("smtp: 550 mailbox unavailable"))
		}
		return nil
	})
	for _, customer := range []string{"acme", "acme", "globex"} {
		if err := outbox.PublishAlone(db, outbox.Event{Type: "invoice.issued", AggregateType: "customer", AggregateID: customer}); err != nil {
			log.Fatal(err)
		}
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}

	mailbox := outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}, ErrorContains: "550"}
	n, err := ob.Count(db, mailbox)
	fmt.Println("would replay", n, err)
	n, err = ob.Count(db, outbox.Filter{Statuses: []outbox.Status{outbox.StatusSent}})
	fmt.Println("sent", n, err)
	// Output:
	// would replay 2 <nil>
	// sent 1 <nil>
}

// Purge deletes sent and failed rows, never pending ones: dropping a poison
// event for good, or trimming history in a maintenance job.
func ExampleOutbox_Purge() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error { return nil })
	for _, id := range []string{"e1", "e2"} {
		if err := outbox.PublishAlone(db, outbox.Event{ID: id, Type: "order.created"}); err != nil {
			log.Fatal(err)
		}
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	if err := outbox.PublishAlone(db, outbox.Event{ID: "e3", Type: "order.created"}); err != nil {
		log.Fatal(err)
	}

	_, err = ob.Purge(db, outbox.Filter{Statuses: []outbox.Status{outbox.StatusPending}})
	fmt.Println("pending refused:", errors.Is(err, outbox.ErrInvalidFilter))

	n, err := ob.Purge(db, outbox.Filter{
		Statuses:     []outbox.Status{outbox.StatusSent},
		CreatedUntil: time.Now().Add(time.Minute),
	})
	fmt.Println("purged", n, err)
	st, err := ob.Stats(db)
	sent, _ := ob.Count(db, outbox.Filter{Statuses: []outbox.Status{outbox.StatusSent}})
	fmt.Println("left: pending", st.Pending, "sent", sent, err)
	// Output:
	// pending refused: true
	// purged 2 <nil>
	// left: pending 1 sent 0 <nil>
}

// Stats is what to alert on: a Failed count that grows, or an OldestPending
// age that keeps climbing because no relay delivers.
func ExampleOutbox_Stats() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error { return nil })
	for range 2 {
		if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"}); err != nil {
			log.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)

	st, err := ob.Stats(db)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending", st.Pending, "oldest waiting:", st.OldestPending > 0)

	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
	st, err = ob.Stats(db)
	if err != nil {
		log.Fatal(err)
	}
	sent, err := ob.Count(db, outbox.Filter{Statuses: []outbox.Status{outbox.StatusSent}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pending %d, sent %d, failed %d, oldest pending %v\n", st.Pending, sent, st.Failed, st.OldestPending)
	// Output:
	// pending 2 oldest waiting: true
	// pending 0, sent 2, failed 0, oldest pending 0s
}
