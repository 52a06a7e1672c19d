package reliability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// sqliteWriters and sqliteTxPerWriter size the SQLite workload;
// OUTBOX_SQLITE_TX raises the transactions per writer for a longer run.
const sqliteWriters = 8

func sqliteTxPerWriter() int {
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_SQLITE_TX")); err == nil && n > 0 {
		return n
	}
	return 60
}

type sqOrder struct {
	ID      string `gorm:"primaryKey"`
	Writer  int    `gorm:"index"`
	EventID string
}

// TestSQLiteConcurrentWriters runs 8 writer goroutines and a relay on one
// SQLite file. Each writer transaction reads first (as real business code
// does), then inserts a business row and publishes its event. With the
// settings the README recommends, no caller may see an error and every
// committed event must be delivered. The other DSNs (and a write-first
// transaction on the default DSN) are measured and logged
// for comparison: they may refuse writes ("database is locked"), but what
// they commit must still be delivered, and nothing uncommitted.
func TestSQLiteConcurrentWriters(t *testing.T) {
	t.Parallel()
	variants := []struct {
		name, params string
		writeFirst   bool
		mustBeClean  bool
	}{
		{"Recommended", recommendedSQLite, false, true},
		{"Defaults", "", false, false},
		{"DefaultsWriteFirst", "", true, false},
		{"WALOnly", "?_journal_mode=WAL", false, false},
		{"WALAndBusyTimeout", "?_journal_mode=WAL&_busy_timeout=10000", false, false},
		{"ImmediateOnly", "?_txlock=immediate", false, false},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			res := runSQLiteWorkload(t, "file:"+sqliteFile(t)+v.params, v.writeFirst)
			t.Logf("SQLITE-RESULT variant=%s dsn_params=%q write_first=%v attempted=%d committed=%d refused=%d locked_errors=%d other_errors=%d relay_error_logs=%d delivered=%d lost=%d duplicated=%d elapsed=%v",
				v.name, v.params, v.writeFirst, res.attempted, res.committed, res.refused, res.locked, res.refused-res.locked,
				res.relayErrors, res.delivered, res.lost, res.duplicated, res.elapsed.Round(time.Millisecond))
			for _, e := range res.samples {
				t.Logf("  sample error: %s", e)
			}
			assert.Zero(t, res.lost, "a committed event was never delivered")
			if v.mustBeClean {
				assert.Zero(t, res.refused, "a caller saw an error with the recommended settings")
				assert.Zero(t, res.relayErrors, "the relay logged errors with the recommended settings")
			}
		})
	}
}

type sqliteResult struct {
	attempted, committed, refused, locked int
	relayErrors                           int
	delivered, lost, duplicated           int
	elapsed                               time.Duration
	samples                               []string
}

// runSQLiteWorkload runs the writers and a relay on dsn. Each transaction
// reads (a count) before it writes unless writeFirst is set, in which case
// the business INSERT comes first and the read after it.
func runSQLiteWorkload(t *testing.T, dsn string, writeFirst bool) sqliteResult {
	db := openGorm(t, sqlite.Open(dsn))
	sink := newLogSink()
	ob := install(t, db, outbox.Config{Logger: sink.logger()})
	require.NoError(t, db.AutoMigrate(&sqOrder{}))
	got := newDeliveries()
	ob.Handle("order.created", got.handle)

	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: 50, PollInterval: 5 * time.Millisecond, Backoff: noBackoff})
	go func() { relayDone <- r.Run(ctx) }()

	perWriter := sqliteTxPerWriter()
	var (
		mu      sync.Mutex
		res     sqliteResult
		wg      sync.WaitGroup
		errRead = errors.New("read failed")
	)
	start := time.Now()
	for w := range sqliteWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				id := fmt.Sprintf("w%d-%04d", w, i)
				err := db.Transaction(func(tx *gorm.DB) error {
					var n int64
					read := func() error {
						if err := tx.Model(&sqOrder{}).Where("writer = ?", w).Count(&n).Error; err != nil {
							return fmt.Errorf("%w: %w", errRead, err)
						}
						return nil
					}
					if !writeFirst {
						if err := read(); err != nil {
							return err
						}
					}
					if err := tx.Create(&sqOrder{ID: id, Writer: w, EventID: id}).Error; err != nil {
						return err
					}
					if writeFirst {
						if err := read(); err != nil {
							return err
						}
					}
					return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", Payload: map[string]any{"n": n}})
				})
				mu.Lock()
				res.attempted++
				if err != nil {
					res.refused++
					if strings.Contains(err.Error(), "database is locked") || strings.Contains(err.Error(), "busy") {
						res.locked++
					}
					if len(res.samples) < 3 {
						res.samples = append(res.samples, err.Error())
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	var committed int64
	require.NoError(t, db.Model(&sqOrder{}).Count(&committed).Error)
	res.committed = int(committed)
	eventually(t, 60*time.Second, func() error {
		var sent int64
		if err := db.Table(ob.Table()).Where("status = ?", outbox.StatusSent).Count(&sent).Error; err != nil {
			return err
		}
		if sent != committed {
			return fmt.Errorf("%d of %d committed events sent", sent, committed)
		}
		return nil
	})
	res.elapsed = time.Since(start)
	cancel()
	require.NoError(t, <-relayDone)

	// Atomicity: one outbox row per committed business row, and no other.
	var rows int64
	require.NoError(t, db.Table(ob.Table()).Count(&rows).Error)
	require.Equal(t, committed, rows, "outbox rows and committed business rows differ")
	var ids []string
	require.NoError(t, db.Model(&sqOrder{}).Pluck("event_id", &ids).Error)
	committedIDs := map[string]bool{}
	for _, id := range ids {
		committedIDs[id] = true
		if got.count(id) == 0 {
			res.lost++
		}
	}
	got.mu.Lock()
	for id := range got.n {
		require.True(t, committedIDs[id], "event %s delivered but its transaction did not commit", id)
	}
	got.mu.Unlock()
	res.delivered, res.duplicated = got.summary()
	res.relayErrors = sink.count("cannot reach") + sink.count("failed")
	return res
}
