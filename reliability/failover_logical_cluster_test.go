package reliability

import (
	"strings"
	"testing"
	"time"
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
	return startPgClusterWith(t, sync, logicalNodeSettings())
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
