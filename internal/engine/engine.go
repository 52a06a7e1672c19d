// Package engine is the outbox's one delivery engine: the rules every
// batch is delivered by, whichever source it came from (the table's claim,
// or Logical mode's WAL stream). A batch's items are fanned out to
// workers, an aggregate's in order on one worker when ordering is on; each
// attempt's handler error is turned into a result by one policy (sent; a
// retry with backoff or failed for good; handed back when the destination
// is down); and a worker starts nothing once the batch's lease budget is
// spent, the relay stops, a destination is down or the source says its
// hold on the batch may be gone. Sources record the results.
//
// It is internal: the root package's Relay drives it and converts its
// types.
package engine

import (
	"time"
)

// Event mirrors outbox.Event field for field, so that the root package
// converts between the two for free.
type Event struct {
	ID             string
	Type           string
	AggregateType  string
	AggregateID    string
	IdempotencyKey string
	Payload        any
	Headers        map[string]string
	OccurredAt     time.Time
}

// Item is one event of a batch.
type Item struct {
	Seq       int64 // the database's write order (0 for an event from the stream)
	Event     Event
	Attempts  int       // this one included
	CreatedAt time.Time // when it was written (or committed)
	// Bad is why the item could not be decoded; it fails for good without
	// delivery.
	Bad error
}

// Budget is how long a batch's deliveries may run under a lease: room is
// left to record the outcomes before another relay may claim the rows.
func Budget(lease time.Duration) time.Duration {
	return lease - min(lease/5, 5*time.Second)
}
