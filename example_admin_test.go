package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/gorm-outbox/outbox"
)

// List, Replay and Purge are what an operator needs when events fail:
// see which failed and why, put them back, or drop one that can never be
// delivered. The outbox command and the dashboard are built on them.
func ExampleOutbox_Replay() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	down := true
	ob.Handle("invoice.issued", func(ctx context.Context, e outbox.Event) error {
		if down {
			return outbox.Permanent(errors.New("mailer: 550 mailbox unavailable"))
		}
		return nil
	})
	for _, id := range []string{"inv-1", "inv-2"} {
		if err := outbox.PublishAlone(db, outbox.Event{ID: id, Type: "invoice.issued", Payload: id}); err != nil {
			log.Fatal(err)
		}
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(ctx); err != nil {
		log.Fatal(err)
	}

	failed, err := ob.List(db.WithContext(ctx), outbox.ListParams{Filter: outbox.Filter{
		Statuses: []outbox.Status{outbox.StatusFailed}, ErrorContains: "mailbox unavailable",
	}})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range failed {
		fmt.Println(r.ID, r.Status, *r.LastError)
	}

	down = false
	n, err := ob.Replay(db.WithContext(ctx), outbox.Filter{IDs: []string{"inv-1"}})
	fmt.Println("replayed", n, err)
	n, err = ob.Purge(db.WithContext(ctx), outbox.Filter{IDs: []string{"inv-2"}})
	fmt.Println("purged", n, err)
	if _, err := relay.ProcessOnce(ctx); err != nil {
		log.Fatal(err)
	}
	st, err := ob.Stats(db.WithContext(ctx))
	sent, _ := ob.Count(db.WithContext(ctx), outbox.Filter{Statuses: []outbox.Status{outbox.StatusSent}})
	fmt.Printf("sent %d, failed %d, pending %d, %v\n", sent, st.Failed, st.Pending, err)
	// Output:
	// inv-1 failed mailer: 550 mailbox unavailable (permanent)
	// inv-2 failed mailer: 550 mailbox unavailable (permanent)
	// replayed 1 <nil>
	// purged 1 <nil>
	// sent 1, failed 0, pending 0, <nil>
}
