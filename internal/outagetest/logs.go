package outagetest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// LogRecorder is a slog.Handler that keeps every record, at every level,
// as its message and a flat text of its attributes.
type LogRecorder struct {
	mu    *sync.Mutex
	recs  *[]LogRecord
	attrs []slog.Attr
}

// LogRecord is one record a LogRecorder kept.
type LogRecord struct {
	Level slog.Level
	Msg   string
	Text  string // message and attributes
}

// NewLogRecorder returns an empty recorder.
func NewLogRecorder() *LogRecorder {
	return &LogRecorder{mu: new(sync.Mutex), recs: new([]LogRecord)}
}

func (h *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true }
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.mu.Lock()
	*h.recs = append(*h.recs, LogRecord{Level: r.Level, Msg: r.Message, Text: b.String()})
	h.mu.Unlock()
	return nil
}

func (h *LogRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(slices.Clip(h.attrs), as...)
	return &c
}

func (h *LogRecorder) WithGroup(string) slog.Handler { return h }

// Records returns a copy of what was logged so far.
func (h *LogRecorder) Records() []LogRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.recs)
}

// Count returns how many records' messages start with prefix.
func (h *LogRecorder) Count(prefix string) int {
	n := 0
	for _, r := range h.Records() {
		if strings.HasPrefix(r.Msg, prefix) {
			n++
		}
	}
	return n
}

// The relay's messages the outage tests count.
const (
	LogPaused  = "outbox: destination unavailable; delivery paused"
	LogResumed = "outbox: destination available again; delivery resumed"
	LogRetry   = "outbox: delivery failed; will retry"
	LogFailed  = "outbox: event failed for good"
)
