package outbox_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"sync"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// A database per tenant: one Outbox (one set of handlers) installed on
// each, and one RelayGroup delivering them all, at most MaxActive batches
// at a time, tenants taking turns.
func ExampleOutbox_RelayGroup() {
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	tenants := map[string]*gorm.DB{}
	for _, name := range []string{"acme", "globex", "initech"} {
		db, closeDB := openDB()
		defer closeDB()
		if err := db.Use(ob); err != nil {
			log.Fatal(err)
		}
		tenants[name] = db
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	delivered := map[string]int{}
	ob.Handle("invoice.sent", func(_ context.Context, e outbox.Event) error {
		mu.Lock()
		delivered[e.AggregateID]++
		mu.Unlock()
		wg.Done()
		return nil
	})

	group, err := ob.RelayGroup(outbox.RelayGroupConfig{MaxActive: 2})
	if err != nil {
		log.Fatal(err)
	}
	for name, db := range tenants {
		if err := group.Add(name, db); err != nil {
			log.Fatal(err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- group.Run(ctx) }()

	for name, db := range tenants {
		wg.Add(2)
		for range 2 {
			if err := outbox.PublishAlone(db, outbox.Event{Type: "invoice.sent", AggregateType: "tenant", AggregateID: name}); err != nil {
				log.Fatal(err)
			}
		}
	}
	wg.Wait()
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	for _, name := range group.Names() {
		sent, err := ob.Count(tenants[name], outbox.Filter{Statuses: []outbox.Status{outbox.StatusSent}})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %d delivered, %d sent in its table\n", name, delivered[name], sent)
	}
	fmt.Println("removed:", group.Remove("acme"), group.Names())
	// Output:
	// acme: 2 delivered, 2 sent in its table
	// globex: 2 delivered, 2 sent in its table
	// initech: 2 delivered, 2 sent in its table
	// removed: true [globex initech]
}
