package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWaitReplicas: with RelayConfig.WaitReplicas, a batch whose WAL no
// standby has flushed is handed back undelivered, no attempt counted; the
// option needs PostgreSQL. That it delivers once a standby has flushed,
// and that it keeps phantom deliveries out of a failover, is
// reliability's TestPostgresFailover/async-await.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	lite := sqliteBackend.setup(t)
	_, err := lite.ob.Relay(lite.db, RelayConfig{WaitReplicas: 1})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = lite.ob.Relay(lite.db, RelayConfig{WaitReplicas: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)

	e := postgresBackend(t).setup(t) // a server without standbys
	var called atomic.Bool           // the relay's workers run concurrently
	e.ob.Handle("x", func(context.Context, Event) error { called.Store(true); return nil })
	publishN(t, e.db, "x", 3)
	// StatementTimeout is also how long the relay waits for the standbys.
	// It bounds the claim too: short, but not so short that a loaded
	// machine's claim runs out of it before the wait is reached.
	const wait = time.Second
	r := e.relay(RelayConfig{WaitReplicas: 1, StatementTimeout: wait})
	start := time.Now()
	n, err := r.ProcessOnce(t.Context())
	require.ErrorIs(t, err, ErrReplicasBehind)
	assert.Equal(t, 3, n, "claimed, then handed back")
	assert.GreaterOrEqual(t, time.Since(start), wait, "it waited StatementTimeout")
	assert.False(t, called.Load(), "nothing delivered")
	rows, err := e.ob.List(e.db.WithContext(t.Context()), ListParams{})
	require.NoError(t, err)
	for _, row := range rows {
		assert.Equal(t, StatusPending, row.Status)
		assert.Zero(t, row.Attempts, "no attempt counted")
		assert.Nil(t, row.LockedUntil, "the lease is given up")
	}
	// Without the option the same relay settings deliver.
	r = e.relay(RelayConfig{StatementTimeout: wait})
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.True(t, called.Load())
}

// TestWaitReplicasLogical: in Logical mode the gate holds the events the
// relay streams as it holds the table's: a streamed batch whose WAL no
// standby has flushed is written to the table undelivered, due at once and
// no attempt counted, where the table's relay holds it the same way.
func TestWaitReplicasLogical(t *testing.T) {
	t.Parallel()
	e := logicalBackend(t).setup(t) // a server without standbys
	var called atomic.Bool
	e.ob.Handle("x", func(context.Context, Event) error { called.Store(true); return nil })
	require.NoError(t, PublishAlone(e.db, Event{Type: "x"}, Event{Type: "x"}, Event{Type: "x"}))
	r := e.relay(RelayConfig{WaitReplicas: 1, StatementTimeout: time.Second}) // as in TestWaitReplicas
	// Under load a first cycle has been seen to stream nothing (CI, once:
	// the stream's session may end before its batch, which the next one
	// receives again): poll, and require that no cycle delivers.
	require.Eventually(t, func() bool {
		_, err := r.ProcessOnce(t.Context())
		assert.False(t, called.Load(), "delivered from the stream")
		return errors.Is(err, ErrReplicasBehind)
	}, 30*time.Second, 50*time.Millisecond, "the stream's batch is held")
	rows, err := e.ob.List(e.db.WithContext(t.Context()), ListParams{})
	require.NoError(t, err)
	require.Len(t, rows, 3, "the streamed events wait in the table")
	for _, row := range rows {
		assert.Equal(t, StatusPending, row.Status)
		assert.Zero(t, row.Attempts, "no attempt counted")
	}
	// The table's relay holds them too. Under load a cycle has been seen
	// to claim nothing first (CI, once in two runs): poll, and require
	// that no cycle delivers.
	require.Eventually(t, func() bool {
		_, err := r.ProcessOnce(t.Context())
		assert.False(t, called.Load(), "delivered from the table")
		return errors.Is(err, ErrReplicasBehind)
	}, 30*time.Second, 50*time.Millisecond, "the table's relay holds them too")
	assert.False(t, called.Load())
}
