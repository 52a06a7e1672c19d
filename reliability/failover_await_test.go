package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// TestWaitReplicasPhantom makes the phantom delivery of asynchronous
// replication happen on purpose, and shows RelayConfig.WaitReplicas
// prevent it: the primary's WAL sender is frozen (SIGSTOP), a business row
// and its event commit on the primary alone, the relay runs, the primary
// dies and the standby, which never received the commit, is promoted.
// Without WaitReplicas the event was delivered and its business row is
// gone (a phantom); with it the relay delivered nothing and the event is
// lost together with its row. The random-kill rig (TestPostgresFailover)
// shows the same in the wild, rarely; this shows the mechanism every time.
func TestWaitReplicasPhantom(t *testing.T) {
	long(t, "a primary and a standby of its own, failed over")
	t.Parallel()
	for _, await := range []bool{false, true} {
		t.Run(fmt.Sprintf("await=%v", await), func(t *testing.T) {
			t.Parallel()
			cl := startPgCluster(t, false)
			db := openGorm(t, postgres.Open(cl.dsn("outbox-await")))
			ob := install(t, db, outbox.Config{Logger: slog.New(slog.DiscardHandler), DisableNotify: true})
			require.NoError(t, db.Exec(`CREATE TABLE aw_orders (id text PRIMARY KEY)`).Error)
			var (
				mu        sync.Mutex
				delivered []string
			)
			ob.Handle("order.created", func(_ context.Context, e outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				delivered = append(delivered, e.ID)
				return nil
			})
			// StatementTimeout bounds the wait for the standby (and every
			// statement of the relay): short, so that the awaiting relay
			// gives up on the frozen standby soon (each wait lasts all of
			// it), but not so short that a claim on a busy machine times
			// out (300 ms did).
			cfg := outbox.RelayConfig{StatementTimeout: min(byLoad(2*time.Second), 10*time.Second)}
			if await {
				cfg.WaitReplicas = 1
			}
			relay, err := ob.Relay(db, cfg)
			require.NoError(t, err)
			order := func(id string) {
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Exec(`INSERT INTO aw_orders (id) VALUES (?)`, id).Error; err != nil {
						return err
					}
					return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created"})
				}))
			}

			// Replicated: delivered either way.
			order("before")
			_, err = relay.ProcessOnce(t.Context())
			require.NoError(t, err)
			// On the standby before its WAL sender stops, with the table:
			// without WaitReplicas nothing waited for it, and a standby
			// that lags (CI saw one, under load) is promoted without them.
			cl.caughtUp(t)

			var pid int
			require.NoError(t, cl.queryRow(`SELECT pid FROM pg_stat_replication`, &pid))
			require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
			// A stopped WAL sender would hold its server's shutdown (the
			// cluster's cleanup) forever if the test fails before the kill.
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
			order("unreplicated")
			_, err = relay.ProcessOnce(t.Context())
			if await {
				require.ErrorIs(t, err, outbox.ErrReplicasBehind)
			} else {
				require.NoError(t, err)
			}
			cl.kill(t)
			_ = syscall.Kill(pid, syscall.SIGCONT) // gone with its primary; harmless if not
			cl.promote(t)

			var business []string
			eventually(t, 30*time.Second, func() error {
				business = nil
				return db.Raw(`SELECT id FROM aw_orders ORDER BY id`).Scan(&business).Error
			})
			assert.Equal(t, []string{"before"}, business, "the unreplicated commit is gone with the old primary")
			mu.Lock()
			got := append([]string(nil), delivered...)
			mu.Unlock()
			if await {
				assert.Equal(t, []string{"before"}, got, "nothing delivered that the standby lacked: lost together, no phantom")
			} else {
				assert.Equal(t, []string{"before", "unreplicated"}, got, "the phantom: delivered, and its business row is gone")
			}
			// The new primary has no standby: an awaiting relay delivers
			// nothing until one connects, and hands its batches back.
			order("after")
			_, err = relay.ProcessOnce(t.Context())
			if await {
				assert.True(t, errors.Is(err, outbox.ErrReplicasBehind), "no standby: %v", err)
				cl.rebuild(t)
				eventually(t, 30*time.Second, func() error {
					_, err := relay.ProcessOnce(t.Context())
					return err
				})
			} else {
				require.NoError(t, err)
			}
			mu.Lock()
			assert.Contains(t, delivered, "after")
			mu.Unlock()
		})
	}
}
