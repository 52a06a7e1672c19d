package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// Through a backlog of quick batches the loop claims the next batch while
// it delivers one, and delivers it next, once that delivery returned; a
// delivery that fails, or a stop, hands the batch claimed ahead back (every
// item Deferred, closed); a batch that is not quick, or that another relay
// claimed among, claims nothing ahead.
func TestLoopClaimsAhead(t *testing.T) {
	type result struct {
		claimed, delivered []*fakeBatch
		ahead              []bool // per claim: made by a claim ahead
	}
	// drive runs a loop through backlog events in batches of 10; deliver
	// decides the k-th delivery's error (and may stop the loop); shared
	// batches say another relay claimed among their rows.
	drive := func(quick time.Duration, backlog int, shared bool, deliver func(k int, cancel func()) error) result {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var (
			mu         sync.Mutex
			r          result
			delivering bool
			seq        int
		)
		l := &Loop{
			BatchSize: 10, Quick: quick, PollInterval: time.Millisecond,
			Logger: slog.New(slog.DiscardHandler),
			Claim: func(_ context.Context, limit int) (Batch, error) {
				mu.Lock()
				defer mu.Unlock()
				n := min(limit, backlog)
				backlog -= n
				if n == 0 {
					cancel() // drained
					return nil, nil
				}
				var ids []string
				for range n {
					seq++
					ids = append(ids, fmt.Sprintf("e%03d", seq))
				}
				b := newFake(ids...)
				b.shared = shared
				// Ahead: claimed by the goroutine Loop starts for a claim
				// ahead, which the stack tells whatever the scheduler did
				// (a timing window would let a claim ahead made late pass
				// for none).
				ahead := strings.Contains(string(debug.Stack()), ".claimAhead.")
				r.ahead = append(r.ahead, ahead)
				r.claimed = append(r.claimed, b)
				return b, nil
			},
			Deliver: func(_ context.Context, b Batch) (int, error) {
				mu.Lock()
				if delivering {
					t.Error("a batch delivered while another was")
				}
				delivering = true
				k := len(r.delivered)
				r.delivered = append(r.delivered, b.(*fakeBatch))
				mu.Unlock()
				err := deliver(k, cancel)
				mu.Lock()
				delivering = false
				mu.Unlock()
				if err != nil {
					return 0, err
				}
				return len(b.Items()), nil
			},
		}
		l.Run(ctx)
		return r
	}
	ok := func(int, func()) error { return nil }

	r := drive(time.Hour, 60, false, ok)
	assert.Equal(t, []bool{false, false, true, true, true, true}, r.ahead, "claimed ahead from the batch after the first quick one")
	assert.Equal(t, r.claimed, r.delivered, "each batch delivered once, in the order claimed")

	r = drive(0, 60, false, ok)
	assert.NotContains(t, r.ahead, true, "no batch is quick: nothing claimed ahead")
	assert.Equal(t, r.claimed, r.delivered)

	r = drive(time.Hour, 60, true, ok)
	assert.NotContains(t, r.ahead, true, "other relays claim among the batches: nothing claimed ahead")
	assert.Equal(t, r.claimed, r.delivered)

	r = drive(time.Hour, 100, false, func(k int, _ func()) error {
		if k == 2 {
			return errors.New("table unreachable")
		}
		return nil
	})
	require.GreaterOrEqual(t, len(r.claimed), 7)
	assert.Equal(t, []bool{false, false, true, true, false, false, true}, r.ahead[:7],
		"after a failed delivery the next claim waits its turn, and the one after a quick full batch is ahead again")
	back := r.claimed[3] // claimed while the third batch was delivered, and failed
	assert.NotContains(t, r.delivered, back, "the batch claimed ahead is not delivered")
	assert.Equal(t, 1, back.closes, "and it is closed")
	for _, k := range back.kinds() {
		assert.Equal(t, Deferred, k, "with every item handed back")
	}
	assert.Len(t, back.results, 10)

	r = drive(time.Hour, 100, false, func(k int, cancel func()) error {
		if k == 3 {
			cancel() // the relay stops during the fourth delivery
		}
		return nil
	})
	require.Len(t, r.claimed, 5, "the fifth claimed ahead while the fourth was delivered")
	assert.Len(t, r.delivered, 4)
	assert.Equal(t, 1, r.claimed[4].closes, "a stop hands the batch claimed ahead back")
	assert.Len(t, r.claimed[4].results, 10)
	for _, k := range r.claimed[4].kinds() {
		assert.Equal(t, Deferred, k)
	}
}
