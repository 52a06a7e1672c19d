package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"time"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/wire"
)

// New returns a Sender for one endpoint; registered as a handler (its
// AsyncHandler, with HandleAsync), it posts every event as a signed
// envelope. A 2xx delivers the event, a 4xx fails it
// for good, a 5xx is retried: here the receiver refuses one event as
// unprocessable.
func ExampleNew() {
	key := []byte("whsec_example")
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer example-token" || webhook.Verify(key, r.Header, body, 0) != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var env webhook.Envelope
		if err := json.Unmarshal(body, &env); err != nil || env.AggregateID == "" {
			http.Error(w, "no customer", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	dir, err := os.MkdirTemp("", "webhook-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+outbox.SQLiteDSNOptions),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}

	sender, err := webhook.New(receiver.URL+"/hooks/outbox", key, webhook.Config{
		Timeout: 5 * time.Second,
		Header:  http.Header{"Authorization": {"Bearer example-token"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	ob.HandleAsync("customer.updated", sender.AsyncHandler())

	err = outbox.PublishAlone(db, // no business write here: the events by themselves
		outbox.Event{ID: "ok", Type: "customer.updated", AggregateType: "customer", AggregateID: "c-1"},
		outbox.Event{ID: "bad", Type: "customer.updated"},
	)
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
	for _, id := range []string{"ok", "bad"} {
		r, err := ob.Get(db, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id, r.Status, r.Attempts)
	}
	// Output:
	// ok sent 1
	// bad failed 1
}

// AsyncHandler is the handler to register with a relay: it starts each
// event's request and returns at once, so that a relay has a whole batch's
// requests in flight (up to Config.MaxInFlight at a time to the endpoint)
// instead of one per worker. With OrderByAggregate an aggregate's next
// event is posted only after the previous one's 2xx: here the receiver
// refuses order 2's payment for good (422), and its shipment is held back.
func ExampleSender_AsyncHandler() {
	key := []byte("whsec_example")
	var (
		mu  sync.Mutex
		got = map[string][]string{} // per order, in arrival order
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var env webhook.Envelope
		if webhook.Verify(key, r.Header, body, 0) != nil || json.Unmarshal(body, &env) != nil {
			http.Error(w, "bad request", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		got[env.AggregateID] = append(got[env.AggregateID], env.Type)
		mu.Unlock()
		if env.ID == "2-paid" {
			http.Error(w, "card declined", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	dir, err := os.MkdirTemp("", "webhook-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+outbox.SQLiteDSNOptions),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}

	sender, err := webhook.New(receiver.URL+"/hooks/orders", key, webhook.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob.HandleAsync(outbox.AnyEvent, sender.AsyncHandler())

	var events []outbox.Event
	for _, order := range []string{"1", "2"} {
		for _, step := range []string{"created", "paid", "shipped"} {
			events = append(events, outbox.Event{ID: order + "-" + step, Type: "order." + step, AggregateType: "order", AggregateID: order})
		}
	}
	if err := outbox.PublishAlone(db, events...); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{OrderByAggregate: true})
	if err != nil {
		log.Fatal(err)
	}
	for { // a service runs relay.Run(ctx) instead
		n, err := relay.ProcessOnce(context.Background())
		if err != nil {
			log.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	fmt.Println("order 1 received:", got["1"])
	fmt.Println("order 2 received:", got["2"])
	for _, e := range events {
		r, err := ob.Get(db, e.ID)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.ID, r.Status)
	}
	// Output:
	// order 1 received: [order.created order.paid order.shipped]
	// order 2 received: [order.created order.paid]
	// 1-created sent
	// 1-paid sent
	// 1-shipped sent
	// 2-created sent
	// 2-paid failed
	// 2-shipped pending
}

// Sign is the 0.1 scheme (Config.Signature: webhook.XOutboxSignature)
// spelled out, for receivers written in other languages: "sha256=" and the
// hex HMAC-SHA256, under the shared secret, of the X-Outbox-Timestamp
// value, a dot and the raw body. Go receivers call Verify, which also
// checks the timestamp's age.
func ExampleSign() {
	body := []byte(`{"id":"e1","type":"order.created","payload":{"total":42}}`)
	fmt.Println(webhook.Sign([]byte("whsec_example"), "1767323045", body))

	// A request as a Sender makes it, checked as a receiver would.
	ts := fmt.Sprint(time.Now().Unix())
	h := http.Header{}
	h.Set(webhook.HeaderTimestamp, ts)
	h.Set(webhook.HeaderSignature, webhook.Sign([]byte("whsec_example"), ts, body))
	h.Set(wire.EventID, "e1")
	fmt.Println(webhook.Verify([]byte("whsec_example"), h, body, 0))
	fmt.Println(webhook.Verify([]byte("another secret"), h, body, 0) != nil)
	// Output:
	// sha256=c50e9bd71c8a1e87e312b499db5e4fbd43b57edf1b411b1fd0c433bc70f37216
	// <nil>
	// true
}

// SignStandardWebhooks is one entry of the default scheme's
// webhook-signature header: what any Standard Webhooks library checks,
// given the key as EncodeSecret writes it.
func ExampleSignStandardWebhooks() {
	key := []byte("a 24-byte or longer key!")
	fmt.Println(webhook.EncodeSecret(key)) // the receiver's configuration
	body := []byte(`{"total":42}`)
	sig := webhook.SignStandardWebhooks(key, "e1", "1767323045", body)
	fmt.Println(sig)

	// A request as a Sender makes it (with a current timestamp), checked as
	// a receiver would.
	ts := fmt.Sprint(time.Now().Unix())
	h := http.Header{}
	h.Set(webhook.HeaderWebhookID, "e1")
	h.Set(webhook.HeaderWebhookTimestamp, ts)
	h.Set(webhook.HeaderWebhookSignature, webhook.SignStandardWebhooks(key, "e1", ts, body))
	fmt.Println(webhook.Verify(key, h, body, 0))
	h.Set(webhook.HeaderWebhookID, "e2")
	fmt.Println(webhook.Verify(key, h, body, 0) != nil)
	// Output:
	// whsec_YSAyNC1ieXRlIG9yIGxvbmdlciBrZXkh
	// v1,JvwewBCbQ0auYhFLY3GquBtUAWmSkxA+CVAgDzoAEHY=
	// <nil>
	// true
}
