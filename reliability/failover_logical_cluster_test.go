package reliability

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// The failover rig (failover_cluster_test.go) with wal_level=logical on
// every node, for Logical mode: the same pgCluster, started and rebuilt
// with these settings. Every node needs them, since each standby becomes
// the primary a relay streams from after its promotion.

// logicalNodeSettings are failoverNodeSettings with wal_level=logical and
// room for replication slots (one the test's, pg_basebackup's temporary
// one) and WAL senders (the standby's, the relay's, pg_basebackup's).
func logicalNodeSettings() []string {
	var out []string
	for _, kv := range failoverNodeSettings {
		if !strings.HasPrefix(kv, "wal_level=") && !strings.HasPrefix(kv, "max_wal_senders=") {
			out = append(out, kv)
		}
	}
	return append(out, "wal_level=logical", "max_replication_slots=10", "max_wal_senders=10")
}

// startLogicalPgCluster is startPgCluster with logicalNodeSettings.
func startLogicalPgCluster(t *testing.T, sync bool) *pgCluster {
	t.Helper()
	primary, err := pgtest.Start(logicalNodeSettings()...)
	if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv("CI") == "" {
		t.Skipf("the failover tests need a PostgreSQL installation: %v", err)
	}
	require.NoError(t, err)
	c := &pgCluster{sync: sync}
	c.nodes[0], c.names[0], c.gen = primary, "node0", 1
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n != nil {
				n.Close()
			}
		}
	})
	c.addLogicalStandby(t, 1, 0)
	return c
}

// addLogicalStandby is addStandby with logicalNodeSettings.
func (c *pgCluster) addLogicalStandby(t *testing.T, slot, port int) {
	t.Helper()
	name := fmt.Sprintf("node%d", c.gen)
	c.gen++
	st, err := c.nodes[c.primary].Standby(name, port, logicalNodeSettings()...)
	require.NoError(t, err)
	c.nodes[slot], c.names[slot] = st, name
	if c.sync {
		c.exec(t, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names TO '%s'", name))
		c.exec(t, "SELECT pg_reload_conf()")
	}
	var target string
	require.NoError(t, c.queryRow(`SELECT pg_current_wal_lsn()::text`, &target))
	want := "async"
	if c.sync {
		want = "sync"
	}
	eventually(t, 30*time.Second, func() error {
		var state, syncState string
		var flushed bool
		err := c.queryRowArgs(`SELECT state, sync_state, COALESCE(flush_lsn >= $2::pg_lsn, false)
			FROM pg_stat_replication WHERE application_name = $1`, []any{name, target}, &state, &syncState, &flushed)
		if err != nil {
			return fmt.Errorf("standby %s: %w", name, err)
		}
		if state != "streaming" || syncState != want || !flushed {
			return fmt.Errorf("standby %s: state %s, sync_state %s (want streaming, %s), caught up: %v", name, state, syncState, want, flushed)
		}
		return nil
	})
}

// rebuildLogical is rebuild with logicalNodeSettings.
func (c *pgCluster) rebuildLogical(t *testing.T) {
	t.Helper()
	slot := c.standby()
	port := c.nodes[slot].Port()
	c.nodes[slot].Close()
	c.nodes[slot] = nil
	c.addLogicalStandby(t, slot, port)
}

// recordAfter returns the first record after t whose message contains
// substr.
func (l *timedLog) recordAfter(t time.Time, substr string) (timedRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.at.After(t) && strings.Contains(r.msg, substr) {
			return r, true
		}
	}
	return timedRecord{}, false
}
