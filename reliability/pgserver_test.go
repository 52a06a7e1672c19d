package reliability

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pgServer is a PostgreSQL instance owned by one test (internal/pgtest):
// its own data directory and loopback port, stopped and started at will.
type pgServer struct{ *pgtest.Server }

// startOwnedPostgres initialises and starts a server, removed at the end of
// the test. Without the server binaries it skips, except under CI.
func startOwnedPostgres(t *testing.T) *pgServer {
	t.Helper()
	s, err := pgtest.Start()
	if errors.Is(err, pgtest.ErrNoBinaries) && !strict() {
		noteSkip("no PostgreSQL server binaries", t.Name())
		t.Skipf("%v", err)
	}
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return &pgServer{s}
}

// dsn returns a URL DSN for database "postgres" on the server.
func (s *pgServer) dsn() string { return s.DSN("postgres") }

// start starts the stopped server and waits until it accepts connections.
func (s *pgServer) start(t *testing.T) {
	t.Helper()
	require.NoError(t, s.Start())
}

// stop sends sig to the postmaster (SIGINT: fast shutdown; SIGQUIT:
// immediate shutdown, crash recovery at the next start) and waits for it.
func (s *pgServer) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := s.Stop(sig); err != nil {
		t.Error(err)
	}
}

// TestRelayRunSurvivesPostgresRestarts stops a test-owned PostgreSQL twice
// under a running relay and a steady writer, once with a fast shutdown and
// once with an immediate one (crash recovery at restart), each time keeping
// it down for a second. The relay (connected through the fault proxy, which
// counts its connection attempts) must not exit, must not spin, must log
// each outage once, and must deliver every committed event.
func TestRelayRunSurvivesPostgresRestarts(t *testing.T) {
	long(t, "a PostgreSQL of its own, restarted under a running relay")
	t.Parallel()
	srv := startOwnedPostgres(t)
	e := newFaultEnvDSN(t, postgresServer(), srv.dsn(), 0)
	signals := []syscall.Signal{syscall.SIGINT, syscall.SIGQUIT}
	var downFor []time.Duration
	rep := runThroughOutages(t, e, len(signals), func(i int) {
		began := time.Now()
		srv.stop(t, signals[i])
		timer := time.NewTimer(time.Second) // how long the server stays down
		<-timer.C
		srv.start(t)
		downFor = append(downFor, time.Since(began).Round(time.Millisecond))
	})
	for i, a := range rep.attempts {
		assert.LessOrEqual(t, a, int64(maxAttemptsPerOutage), "restart %d: the relay spun", i+1)
	}
	t.Logf("FAULT-RESULT scenario=postgres-restarts restarts=%d (fast, immediate) down_for=%v attempts_per_outage=%v events=%d delivered=%d lost=0 duplicated=%d cannot_reach_logs=%d recovered_logs=%d",
		len(signals), downFor, rep.attempts, rep.published, rep.delivered, rep.duplicated, rep.cannotReach, rep.recovered)
}
