package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// logRecorder is a slog.Handler that keeps every record, at every level,
// as its message and a flat text of its attributes.
type logRecorder struct {
	mu    *sync.Mutex
	recs  *[]logRecord
	attrs []slog.Attr
}

type logRecord struct {
	Level slog.Level
	Msg   string
	Text  string // message and attributes
}

func newLogRecorder() *logRecorder {
	return &logRecorder{mu: new(sync.Mutex), recs: new([]logRecord)}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true }
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.mu.Lock()
	*h.recs = append(*h.recs, logRecord{Level: r.Level, Msg: r.Message, Text: b.String()})
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(slices.Clip(h.attrs), as...)
	return &c
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

func (h *logRecorder) records() []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.recs)
}

// count returns how many records' messages start with prefix.
func (h *logRecorder) count(prefix string) int {
	n := 0
	for _, r := range h.records() {
		if strings.HasPrefix(r.Msg, prefix) {
			n++
		}
	}
	return n
}

// The relay's messages the outage tests count.
const (
	logPaused  = "outbox: destination unavailable; delivery paused"
	logResumed = "outbox: destination available again; delivery resumed"
	logRetry   = "outbox: delivery failed; will retry"
	logFailed  = "outbox: event failed for good"

	adapterLogPrefix = "outbox/kafka:"
)
