package storetest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testConcurrency(t *testing.T, su *suite) {
	// Claimers at once never get the same row while its lease lives.
	t.Run("Claims", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		const rows, claimers = 300, 4
		evs := make([]store.Event, rows)
		for i := range evs {
			evs[i] = generated()
		}
		require.EqualValues(t, rows, e.insert(now, evs...))

		var (
			mu   sync.Mutex
			by   = map[string]int{}
			dups []string
			wg   sync.WaitGroup
			errs = make([]error, claimers)
		)
		for w := range claimers {
			wg.Go(func() {
				lease := now.Add(time.Hour + time.Duration(w)*µs)
				for range rows + 1 { // a claim that takes no row ends it sooner
					got, err := e.s.Claim(e.ctx, e.db, store.ClaimSpec{Now: now, Lease: lease, Limit: 7})
					if err != nil {
						errs[w] = err
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					for _, c := range got {
						if prev, ok := by[c.ID]; ok {
							dups = append(dups, fmt.Sprintf("%s by %d and %d", c.ID, prev, w))
						}
						by[c.ID] = w
					}
					stop := len(dups) > 0
					mu.Unlock()
					if stop {
						return
					}
				}
				errs[w] = fmt.Errorf("claimer %d: the claims never ran dry", w)
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		assert.Empty(t, dups, "rows claimed twice under a live lease")
		assert.Len(t, by, rows, "every row claimed")
		for id, s := range e.states() {
			assert.Equal(t, state{"pending", 1}, s, "%s: one attempt", id)
		}
	})

	// Ordered claimers, marking their batches sent, while a writer adds
	// events of the same aggregates two at a time: each aggregate is
	// claimed in write order, one row at a time.
	t.Run("OrderedWithWriter", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.ensureOrdering()
		const aggregates, perAggregate, claimers = 20, 10, 3
		var (
			mu      sync.Mutex
			claimed = map[string][]string{} // aggregate -> IDs in claim order
			bad     []string
			wg      sync.WaitGroup
			errs    = make([]error, claimers+1)
			done    = make(chan struct{})
			wrote   = make([]chan struct{}, claimers)
		)
		for i := range wrote {
			wrote[i] = make(chan struct{}, 1)
		}
		idOf := func(a, n int) string { return fmt.Sprintf("a%02d-%02d", a, n) }
		wg.Go(func() {
			defer close(done)
			for n := 0; n < perAggregate; n += 2 {
				for a := range aggregates {
					agID := fmt.Sprint(a)
					rows := []store.Event{agg(idOf(a, n), "acct", agID), agg(idOf(a, n+1), "acct", agID)}
					if _, err := e.s.Insert(e.ctx, e.db, rows, now, false); err != nil {
						errs[claimers] = err
						return
					}
					for _, c := range wrote {
						select {
						case c <- struct{}{}:
						default:
						}
					}
				}
			}
		})
		for w := range claimers {
			wg.Go(func() {
				lease := now.Add(time.Hour + time.Duration(w)*µs)
				finished := false
				for range 10 * aggregates * perAggregate { // ends when a claim after the writer's last takes no row
					got, err := e.s.Claim(e.ctx, e.db, store.ClaimSpec{Now: now, Lease: lease, Limit: 5, Ordered: true})
					if err != nil {
						errs[w] = err
						return
					}
					if len(got) == 0 {
						if finished {
							return
						}
						select {
						case <-wrote[w]:
						case <-done:
							finished = true
						}
						continue
					}
					slices.SortFunc(got, func(a, b store.Claimed) int { return cmp.Compare(a.Seq, b.Seq) })
					seqs := make([]int64, len(got))
					seen := map[string]bool{}
					mu.Lock()
					for i, c := range got {
						seqs[i] = c.Seq
						if seen[c.AggregateID] {
							bad = append(bad, fmt.Sprintf("%s: two rows of aggregate %s in one batch", c.ID, c.AggregateID))
						}
						seen[c.AggregateID] = true
						claimed[c.AggregateID] = append(claimed[c.AggregateID], c.ID)
					}
					mu.Unlock()
					n, err := e.s.MarkSent(e.ctx, e.db, seqs, now, lease)
					if err == nil && n != int64(len(seqs)) {
						err = fmt.Errorf("MarkSent of %d rows claimed under its lease changed %d", len(seqs), n)
					}
					if err != nil {
						errs[w] = err
						return
					}
				}
				errs[w] = fmt.Errorf("claimer %d: the claims never ran dry", w)
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		assert.Empty(t, bad)
		require.Len(t, claimed, aggregates)
		for a := range aggregates {
			want := make([]string, perAggregate)
			for n := range want {
				want[n] = idOf(a, n)
			}
			assert.Equal(t, want, claimed[fmt.Sprint(a)], "aggregate %d claimed in write order, each row once", a)
		}
		for id, s := range e.states() {
			assert.Equal(t, "sent", s.Status, id)
		}
	})
}
