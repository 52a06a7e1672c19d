package wal

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
)

// Prefix prefixes the outbox's WAL messages. Every slot of the database
// decodes every message; the prefix tells the outbox's own.
func Prefix(slot string) string { return "gorm-outbox:" + slot }

// walEvent is an event as it travels in a WAL message.
type walEvent struct {
	ID            string          `json:"id"`
	Type          string          `json:"type"`
	AggregateType string          `json:"aggregate_type,omitempty"`
	AggregateID   string          `json:"aggregate_id,omitempty"`
	Key           string          `json:"key,omitempty"` // omitted when it is the ID
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	OccurredAt    time.Time       `json:"occurred_at"`
	// Checked is set when the publisher chose the ID or the key: the relay
	// enforces first-committed-wins for such events only, since a
	// generated ID cannot repeat.
	Checked bool `json:"checked,omitempty"`
}

// Message is the WAL message of one Publish call: its events, in order.
func Message(events []store.Event) ([]byte, error) {
	msg := make([]walEvent, len(events))
	for i := range events {
		e := &events[i]
		msg[i] = walEvent{
			ID: e.ID, Type: e.Type, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
			Payload: e.Payload, Headers: e.Headers, OccurredAt: e.OccurredAt, Checked: !e.Generated,
		}
		if e.Key != e.ID {
			msg[i].Key = e.Key
		}
	}
	return json.Marshal(msg)
}

// decodeWAL decodes one outbox message into its events.
func decodeWAL(content []byte, commitTime time.Time) ([]walItem, error) {
	var msg []walEvent
	if err := json.Unmarshal(content, &msg); err != nil {
		return nil, err
	}
	items := make([]walItem, len(msg))
	for i, w := range msg {
		if w.ID == "" || w.Type == "" {
			return nil, fmt.Errorf("event %d of %d has no ID or type", i+1, len(msg))
		}
		key := w.Key
		if key == "" {
			key = w.ID
		}
		e := engine.Event{
			ID: w.ID, Type: w.Type, AggregateType: w.AggregateType, AggregateID: w.AggregateID,
			IdempotencyKey: key, Payload: json.RawMessage(w.Payload), OccurredAt: w.OccurredAt.UTC(),
		}
		var bad error
		if len(w.Headers) > 0 {
			if err := json.Unmarshal(w.Headers, &e.Headers); err != nil {
				bad = fmt.Errorf("outbox: decode headers of event %s: %w", e.ID, err)
			}
		}
		items[i] = walItem{
			c: engine.Item{Event: e, Attempts: 1, CreatedAt: commitTime.UTC(), Bad: bad},
			row: store.Event{
				ID: e.ID, Type: e.Type, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Key: key,
				Payload: w.Payload, Headers: w.Headers, OccurredAt: e.OccurredAt, Generated: !w.Checked,
			},
			checked: w.Checked,
		}
	}
	return items, nil
}
