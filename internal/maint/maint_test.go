package maint

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a log destination the service's goroutine and the test
// share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunLogsOncePerEpisode: a service's passes run at once and then every
// Every; a failing stretch is logged when it starts and when it ends, not
// at every pass; Run returns once ctx ends.
func TestRunLogsOncePerEpisode(t *testing.T) {
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	results := []error{nil, errors.New("down"), errors.New("down"), errors.New("down"), nil, nil}
	passes := make(chan int, len(results))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var n int
	svc := Service{Name: "testing", Every: time.Millisecond, Pass: func(context.Context) (int64, error) {
		i := n
		n++
		if i >= len(results) {
			cancel()
			return 0, nil
		}
		passes <- i
		return 0, results[i]
	}}
	done := make(chan struct{})
	go func() { Run(ctx, logger, svc); close(done) }()
	for range results {
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the service stopped running passes")
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "Run did not return when its context ended")
	}
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "outbox: testing failed; will retry"), "one warning for three failed passes:\n%s", out)
	assert.Equal(t, 1, strings.Count(out, "outbox: testing works again"), "one line when it recovers:\n%s", out)
}

// TestBatches: deletes in batches until one comes back short, and stops
// at the first error, counting what was deleted before it.
func TestBatches(t *testing.T) {
	left := int64(25)
	n, err := Batches(t.Context(), 10, time.Second, func(_ context.Context, batch int) (int64, error) {
		d := min(left, int64(batch))
		left -= d
		return d, nil
	})
	require.NoError(t, err)
	assert.Equal(t, int64(25), n)
	assert.Zero(t, left)

	calls := 0
	n, err = Batches(t.Context(), 10, time.Second, func(context.Context, int) (int64, error) {
		calls++
		if calls == 2 {
			return 3, errors.New("lost the connection")
		}
		return 10, nil
	})
	require.Error(t, err)
	assert.Equal(t, int64(13), n)
}

// TestAccumulate: sent rows count as delivered (with their delay) in the
// minute sent and as published in the minute created, in each span.
func TestAccumulate(t *testing.T) {
	rows, n := Accumulate([]store.SentBin{
		{Type: "a", Sent: 125, Created: 61, Bin: 3, N: 2},
		{Type: "a", Sent: 125, Created: 125, Bin: 1, N: 1},
	})
	assert.Equal(t, int64(3), n)
	by := map[[2]int64]store.RollRow{}
	for _, r := range rows {
		require.Equal(t, "a", r.Type)
		by[[2]int64{r.Span, r.Minute}] = r
	}
	assert.Len(t, rows, 6, "minutes 61 and 125, the 10-minute spans from 60 and 120, the hours from 60 and 120")
	assert.Equal(t, int64(3), by[[2]int64{1, 125}].Delivered)
	assert.Equal(t, int64(1), by[[2]int64{1, 125}].Published)
	assert.Equal(t, int64(2), by[[2]int64{1, 61}].Published)
	assert.Equal(t, int64(2), by[[2]int64{1, 125}].Delay[3])
	assert.Equal(t, int64(1), by[[2]int64{1, 125}].Delay[1])
	assert.Equal(t, int64(2), by[[2]int64{10, 60}].Published)
	assert.Equal(t, int64(3), by[[2]int64{60, 120}].Delivered, "minute 125 is in the hour from 120")
	assert.Equal(t, int64(2), by[[2]int64{60, 60}].Published, "minute 61 in the hour from 60")
}
