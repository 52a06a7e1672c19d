package engine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The claim grows through a backlog of quick batches, doubling up to
// MaxBatch, and is BatchSize again once a claim is not full; a full batch
// that was not quick halves it; without MaxBatch it never grows.
func TestLoopGrowsThroughABacklog(t *testing.T) {
	run := func(maxBatch int, quick time.Duration, backlog int) []int {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var limits []int
		l := &Loop{
			BatchSize: 100, MaxBatch: maxBatch, Quick: quick, PollInterval: time.Millisecond,
			Logger: slog.New(slog.DiscardHandler),
			Process: func(_ context.Context, _ []int64, limit int) (int, int, error) {
				limits = append(limits, limit)
				n := min(limit, backlog)
				backlog -= n
				if n == 0 {
					cancel() // drained: the claim after the last
				}
				return n, n, nil
			},
		}
		l.Run(ctx)
		return limits
	}
	assert.Equal(t, []int{100, 200, 400, 800, 1000, 1000, 1000, 1000, 100},
		run(1000, time.Hour, 100+200+400+800+3*1000+399),
		"doubling to MaxBatch through the backlog; BatchSize once a claim is not full")
	assert.Equal(t, []int{100, 100, 100, 100, 100}, run(1000, 0, 350), "no full batch is quick: BatchSize")
	assert.Equal(t, []int{100, 100, 100, 100, 100}, run(0, time.Hour, 350), "no MaxBatch: BatchSize")

	l := &Loop{BatchSize: 100, MaxBatch: 1000, Quick: time.Second}
	assert.Equal(t, 400, l.next(800, 2*time.Second), "a slow full batch halves the claim")
	assert.Equal(t, 100, l.next(100, 2*time.Second), "not below BatchSize")
	assert.Equal(t, 1000, l.next(800, time.Millisecond), "not above MaxBatch")
}
