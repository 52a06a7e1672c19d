package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Permanent tells the relay that retrying cannot help (a malformed address,
// a 4xx from an API): the event is failed at once instead of burning its
// attempts over hours. Outbox.Replay brings it back once the cause is fixed.
func ExamplePermanent() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("user.invited", func(ctx context.Context, e outbox.Event) error {
		var to string
		if err := e.DecodePayload(&to); err != nil {
			return outbox.Permanent(err) // the payload will not decode any better later
		}
		return outbox.Permanent(fmt.Errorf("invalid address %q", to))
	})
	if err := outbox.PublishAlone(db, outbox.Event{ID: "inv-1", Type: "user.invited", Payload: "ada@"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}

	r, err := ob.Get(db, "inv-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Status, r.Attempts, *r.LastError)
	fmt.Println(outbox.Permanent(nil) == nil)
	// Output:
	// failed 1 invalid address "ada@" (permanent)
	// true
}

// IsPermanent sees the mark through any wrapping, so code around a handler
// (a middleware, a Hooks.Delivered callback) can tell the two failures apart.
func ExampleIsPermanent() {
	err := fmt.Errorf("send invoice 42: %w", outbox.Permanent(errors.New("400 Bad Request")))
	fmt.Println(outbox.IsPermanent(err), outbox.IsPermanent(errors.New("503 Service Unavailable")))
	// Output: true false
}

// Unavailable says the destination is down, not the event: the relay hands
// the event back without counting an attempt and pauses, so an outage of any
// length fails no event. ProcessOnce reports it with an error that
// satisfies IsUnavailable.
func ExampleUnavailable() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	brokerUp := false
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		if !brokerUp {
			return outbox.Unavailable(errors.New("dial tcp 10.0.0.7:4222: connect: connection refused"))
		}
		return nil
	})
	if err := outbox.PublishAlone(db, outbox.Event{ID: "e1", Type: "order.created"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}

	_, err = relay.ProcessOnce(context.Background())
	fmt.Println("broker down:", outbox.IsUnavailable(err))
	r, err := ob.Get(db, "e1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Status, "attempts", r.Attempts)

	brokerUp = true
	n, err := relay.ProcessOnce(context.Background())
	fmt.Println("broker back: claimed", n, err)
	// Output:
	// broker down: true
	// pending attempts 0
	// broker back: claimed 1 <nil>
}

// IsUnavailable lets a caller of ProcessOnce (a cron job, a health check)
// tell an outage of the destination from other failures.
func ExampleIsUnavailable() {
	err := fmt.Errorf("publish: %w", outbox.Unavailable(errors.New("no servers available")))
	fmt.Println(outbox.IsUnavailable(err), outbox.IsUnavailable(errors.New("bad request")))
	// Output: true false
}

// RetryAfter honours a destination that says when to come back (an HTTP 429
// or 503 with Retry-After) instead of the relay's backoff; the attempt still
// counts.
func ExampleRetryAfter() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		return outbox.RetryAfter(errors.New("429 Too Many Requests"), 30*time.Second)
	})
	if err := outbox.PublishAlone(db, outbox.Event{ID: "e1", Type: "order.created"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}

	r, err := ob.Get(db, "e1")
	if err != nil {
		log.Fatal(err)
	}
	wait := time.Until(r.AvailableAt)
	fmt.Println(r.Status, "attempts", r.Attempts, "retry in about 30s:", wait > 25*time.Second && wait <= 30*time.Second)
	n, err := relay.ProcessOnce(context.Background())
	fmt.Println("not due yet: claimed", n, err)
	// Output:
	// pending attempts 1 retry in about 30s: true
	// not due yet: claimed 0 <nil>
}

// Attempt tells a handler which delivery attempt it is running, for a log
// field, a header, or a fallback after the first tries fail.
func ExampleAttempt() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		n := outbox.Attempt(ctx)
		fmt.Println("attempt", n)
		if n == 1 {
			return errors.New("timeout")
		}
		return nil
	})
	if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"}); err != nil {
		log.Fatal(err)
	}
	// No backoff, so that the retry is due at once.
	relay, err := ob.Relay(db, outbox.RelayConfig{Backoff: func(int) time.Duration { return 0 }})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		if _, err := relay.ProcessOnce(context.Background()); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("outside a delivery:", outbox.Attempt(context.Background()))
	// Output:
	// attempt 1
	// attempt 2
	// outside a delivery: 0
}

// DefaultBackoff doubles from about a second up to ten minutes, each delay
// drawn from the upper half of its range so that many failing events do not
// retry in lockstep. A custom RelayConfig.Backoff can build on it.
func ExampleDefaultBackoff() {
	for _, attempt := range []int{1, 2, 3, 10, 11, 50} {
		upper := 10 * time.Minute // the cap, reached after attempt 10
		if attempt <= 10 {
			upper = min(upper, time.Second<<(attempt-1))
		}
		d := outbox.DefaultBackoff(attempt)
		fmt.Printf("after attempt %2d: %v..%v %v\n", attempt, upper/2, upper, d >= upper/2 && d <= upper)
	}
	// Output:
	// after attempt  1: 500ms..1s true
	// after attempt  2: 1s..2s true
	// after attempt  3: 2s..4s true
	// after attempt 10: 4m16s..8m32s true
	// after attempt 11: 5m0s..10m0s true
	// after attempt 50: 5m0s..10m0s true
}

// RelayConfig sets the retry policy: here two attempts with no delay, after
// which the event is failed and waits for an operator.
func ExampleRelayConfig() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		return errors.New("502 Bad Gateway")
	})
	if err := outbox.PublishAlone(db, outbox.Event{ID: "e1", Type: "order.created"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{
		MaxAttempts: 2,
		Backoff:     func(attempt int) time.Duration { return 0 },
	})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if _, err := relay.ProcessOnce(context.Background()); err != nil {
			log.Fatal(err)
		}
		r, err := ob.Get(db, "e1")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(r.Status, r.Attempts)
	}
	// Output:
	// pending 1
	// failed 2
	// failed 2
}

// Hooks are how instrumentation plugs in without the core depending on it:
// Publish can stamp headers on every event, and Delivered sees the outcome
// and timing of every attempt, for metrics or logs.
func ExampleOutbox_AddHooks() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.AddHooks(outbox.Hooks{
		Publish: func(ctx context.Context, e *outbox.Event) {
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers["service"] = "orders"
		},
		Delivered: func(d outbox.Delivery) {
			fmt.Printf("delivered %s: attempt %d, %s, err=%v\n", d.Event.Type, d.Attempt, d.Status, d.Err)
		},
	})
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		fmt.Println("handler sees service =", e.Headers["service"])
		return nil
	})
	if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"}); err != nil {
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
	// handler sees service = orders
	// delivered order.created: attempt 1, sent, err=<nil>
}
