package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/wire"
)

// A receiver that knows neither this library nor its headers: it checks
// the signature with the Standard Webhooks library (any language has one)
// configured with the secret as EncodeSecret writes it, and reads the
// CloudEvent with the CloudEvents SDK. The README's "Wire formats" shows
// the same receiver.
func ExampleConfig_cloudEvents() {
	key := []byte("a 32-byte key shared with the receiver")
	verifier, err := standardwebhooks.NewWebhook(webhook.EncodeSecret(key)) // "whsec_…"
	if err != nil {
		log.Fatal(err)
	}
	received := make(chan string, 1)
	receiver := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := verifier.Verify(body, r.Header); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var order struct{ Total int }
		_ = json.Unmarshal(ev.Data(), &order)
		received <- fmt.Sprintf("%s %s from %s about %s, total %d (id = webhook-id: %t)",
			ev.SpecVersion(), ev.Type(), ev.Source(), ev.Subject(), order.Total, ev.ID() == r.Header.Get("webhook-id"))
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	// The sender: CloudEvents in HTTP binary mode, signed with Standard
	// Webhooks (the default).
	sender, err := webhook.New(srv.URL, key, webhook.Config{Format: wire.CloudEvents, Source: "/orders"})
	if err != nil {
		log.Fatal(err)
	}
	// What a relay does with a committed event.
	err = sender.Handler()(context.Background(), outbox.Event{
		ID: "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10", Type: "order.created",
		AggregateType: "order", AggregateID: "42", IdempotencyKey: "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10",
		OccurredAt: time.Now(), Payload: json.RawMessage(`{"total":3}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-received)
	// Output:
	// 1.0 order.created from /orders about order/42, total 3 (id = webhook-id: true)
}
