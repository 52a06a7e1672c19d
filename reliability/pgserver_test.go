package reliability

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const pgBinDirEnv = "OUTBOX_TEST_PG_BINDIR"

// pgServer is a PostgreSQL instance owned by one test: its own data
// directory in a temp dir, its own loopback port, stopped and started at
// will.
type pgServer struct {
	bin, dir, data string
	port           int
	cred           *syscall.Credential // run as postgres when we are root

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    bytes.Buffer
}

// startOwnedPostgres initialises and starts a server, stopped at the end of
// the test. It skips when the PostgreSQL server binaries are not installed.
func startOwnedPostgres(t *testing.T) *pgServer {
	t.Helper()
	bin := os.Getenv(pgBinDirEnv)
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Skipf("PostgreSQL server binaries not found in %s; set %s to the directory holding initdb and postgres", bin, pgBinDirEnv)
	}
	s := &pgServer{bin: bin}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s.dir, s.data = dir, filepath.Join(dir, "data")
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root and there is no postgres user to run the test server as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		require.NoError(t, os.Chown(dir, uid, gid))
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	out, err := initdb.CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	s.port = freePort(t)
	s.start(t)
	t.Cleanup(func() { s.stop(t, syscall.SIGINT) })
	return s
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// dsn returns a URL DSN for database "postgres" on the server.
func (s *pgServer) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// start starts the server and waits until it accepts connections.
func (s *pgServer) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data, "-p", strconv.Itoa(s.port),
		"-k", s.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
		"-c", "shared_buffers=16MB", "-c", "max_connections=50")
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	s.mu.Lock()
	cmd.Stdout, cmd.Stderr = &lockedBuffer{mu: &s.mu, b: &s.out}, &lockedBuffer{mu: &s.mu, b: &s.out}
	s.mu.Unlock()
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited

	db, err := sql.Open("pgx", s.dsn())
	require.NoError(t, err)
	defer db.Close()
	eventually(t, 60*time.Second, func() error {
		select {
		case <-exited:
			t.Fatalf("postgres exited at startup:\n%s", s.output())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return db.PingContext(ctx)
	})
}

// stop sends sig to the postmaster (SIGINT: fast shutdown; SIGQUIT:
// immediate shutdown, crash recovery at the next start) and waits for it.
func (s *pgServer) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		t.Errorf("postgres did not stop on %v:\n%s", sig, s.output())
	}
}

func (s *pgServer) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestRelayRunSurvivesPostgresRestarts stops a test-owned PostgreSQL twice
// under a running relay and a steady writer, once with a fast shutdown and
// once with an immediate one (crash recovery at restart), each time keeping
// it down for a second. The relay (connected through the fault proxy, which
// counts its connection attempts) must not exit, must not spin, must log
// each outage once, and must deliver every committed event.
func TestRelayRunSurvivesPostgresRestarts(t *testing.T) {
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
