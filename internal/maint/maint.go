// Package maint is the background work that keeps the outbox's tables,
// each a Service of one shape: retention of sent rows and of the event
// history, the rollup the overview reads (run periodically by each
// relay), and the expiry of the inbox's records (run by Consume, a batch
// at a time). Every pass is a few typed store calls; none is on the write
// path, and none puts an event at stake.
//
// It is internal: the root package wires the services of a relay and of an
// Outbox.
package maint

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
)

// Service is one kind of background work.
type Service struct {
	// Name says what a pass does, for the log ("delete old sent events").
	Name string
	// Every is how often Run starts a pass.
	Every time.Duration
	// Pass does one round of the work and returns how many rows it
	// handled.
	Pass func(ctx context.Context) (int64, error)
}

// Run runs each service at once and then every Every, each on a goroutine
// of its own, until ctx ends, and returns when all have stopped. A failing
// pass is logged once per episode (and its recovery once), not every time.
func Run(ctx context.Context, logger *slog.Logger, svcs ...Service) {
	var wg sync.WaitGroup
	for _, s := range svcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.run(ctx, logger)
		}()
	}
	wg.Wait()
}

func (s Service) run(ctx context.Context, logger *slog.Logger) {
	t := time.NewTimer(0)
	defer t.Stop()
	var failing engine.Episode
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := s.Pass(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && failing.Begin():
			logger.WarnContext(ctx, "outbox: "+s.Name+" failed; will retry (no event is at stake)", slog.Any("error", err))
		case err == nil:
			if was, _ := failing.End(); was {
				logger.InfoContext(ctx, "outbox: "+s.Name+" works again")
			}
		}
		t.Reset(s.Every)
	}
}

// Batches runs del, which deletes up to batch rows, until a call deletes
// fewer or ctx ends, each call within timeout, and returns how many rows
// the calls deleted.
func Batches(ctx context.Context, batch int, timeout time.Duration, del func(ctx context.Context, batch int) (int64, error)) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		n, err := del(sctx, batch)
		cancel()
		total += n
		if err != nil || n < int64(batch) {
			return total, err
		}
	}
	return total, ctx.Err()
}
