package reliability

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// TestHostileHandlers runs a relay over a mix of good events and events whose
// handlers panic, block until their deadline, ignore their deadline, or fail
// forever. The good events must all be delivered (exactly once: nothing here
// can cause a redelivery), and each bad row must end 'failed' after
// MaxAttempts with a last_error a human can read.
func TestHostileHandlers(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testHostileHandlers(t, b.open(t))
		})
	}
}

func testHostileHandlers(t *testing.T, db *gorm.DB) {
	const (
		lease       = time.Second // the least a relay accepts
		maxAttempts = 3
		good        = 60
	)
	sink := newLogSink()
	ob := install(t, db, outbox.Config{Logger: sink.logger()})
	got := newDeliveries()
	ob.Handle("good", got.handle)
	counters := map[string]map[string]int{} // no inner map is ever created
	ob.Handle("panics", func(_ context.Context, e outbox.Event) error {
		counters[e.Type]["seen"]++ // a nil map write, as real handlers panic
		return nil
	})
	ob.Handle("blocks", func(ctx context.Context, _ outbox.Event) error {
		<-ctx.Done() // a call that hangs until the relay's deadline
		return fmt.Errorf("webhook call: %w", ctx.Err())
	})
	ob.Handle("ignores-deadline", func(context.Context, outbox.Event) error {
		// Hangs past the lease without looking at ctx.
		timer := time.NewTimer(lease * 3 / 2)
		defer timer.Stop()
		<-timer.C
		return errors.New("slow broker: gave up after 1.5s")
	})
	ob.Handle("errors", func(context.Context, outbox.Event) error {
		return errors.New("downstream said no: HTTP 503")
	})

	bad := map[string]string{ // event type -> what its last_error must say
		"panics":           "handler panicked: assignment to entry in nil map",
		"blocks":           "webhook call: context deadline exceeded",
		"ignores-deadline": "slow broker: gave up after 1.5s",
		"errors":           "downstream said no: HTTP 503",
	}
	// The bad events go first, so they sit in the first batches with good
	// ones behind them.
	var events []outbox.Event
	for typ := range bad {
		events = append(events, outbox.Event{ID: "bad-" + typ, Type: typ, Payload: map[string]string{"k": "v"}})
	}
	for i := range good {
		events = append(events, outbox.Event{ID: fmt.Sprintf("good-%03d", i), Type: "good", Payload: i})
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))

	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{
		BatchSize: 8, PollInterval: 10 * time.Millisecond, Lease: lease,
		MaxAttempts: maxAttempts, Backoff: noBackoff,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	start := time.Now()
	eventually(t, 60*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("Run returned before it was cancelled: %v", err)
		default:
		}
		c := statusCounts(t, db, ob.Table())
		if c[outbox.StatusSent] != good || c[outbox.StatusFailed] != int64(len(bad)) {
			return fmt.Errorf("statuses %v", c)
		}
		return nil
	})
	elapsed := time.Since(start)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(bound(t, 30*time.Second)):
		t.Fatal("Run did not return after cancel")
	}

	for i := range good {
		assert.Equal(t, 1, got.count(fmt.Sprintf("good-%03d", i)), "good event %d", i)
	}
	for typ, want := range bad {
		var rec outbox.Row
		require.NoError(t, db.Table(ob.Table()).Where("named_id = ?", "bad-"+typ).Take(&rec).Error)
		assert.Equal(t, outbox.StatusFailed, rec.Status, typ)
		assert.Equal(t, maxAttempts, rec.Attempts, typ)
		require.NotNil(t, rec.LastError, typ)
		assert.Contains(t, *rec.LastError, want, typ)
		assert.Nil(t, rec.LockedUntil, typ)
	}
	assert.Equal(t, len(bad), sink.count("event failed for good"), "one error log per failed event")
	t.Logf("hostile handlers: %d good events delivered once each, %d bad events failed after %d attempts, in %v",
		good, len(bad), maxAttempts, elapsed.Round(time.Millisecond))
}
