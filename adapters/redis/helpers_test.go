package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

const (
	addrEnv     = "OUTBOX_TEST_REDIS_ADDR"
	defaultAddr = "127.0.0.1:6379"
	fullEnv     = "OUTBOX_TEST_FULL"
	startCmd    = `redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log`
)

// The rules of the repository's two test commands (README, "Testing";
// docs/testing.md), kept here rather than imported: this module requires
// the core at its release version, whose internal packages it cannot use.

// full: the full suite runs (OUTBOX_TEST_FULL=1, what CI runs).
func full() bool { return os.Getenv(fullEnv) == "1" }

// strict: a missing broker or server binary fails the test instead of
// skipping it, in the full suite and under CI, where a skip would turn a
// broken set-up green.
func strict() bool { return full() || os.Getenv("CI") != "" }

// runSelected: go test was given -run, so the tests it runs were named.
func runSelected() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}

// long marks a test that starts servers of its own and takes its time: it
// runs in the full suite or when -run names it, so that the quick command
// stays quick. what says what makes it long.
func long(t *testing.T, what string) {
	t.Helper()
	if full() || runSelected() {
		return
	}
	t.Skipf("a long test (%s): it runs with %s=1 (the full suite) or when -run names it", what, fullEnv)
}

// brokerMissing fails the test: the broker was asked for (its variable is
// set, or the run is strict), so a skip would hide a broken set-up.
func brokerMissing(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Fatalf(format+"\nstart it with:\n  %s", append(args, startCmd)...)
}

// redisBinary is the redis-server binary for a test that starts servers of
// its own (sentinels too: redis-server --sentinel; Debian ships no
// redis-sentinel). Missing, it fails the test in strict mode and skips it
// otherwise.
func redisBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if strict() {
			t.Fatal("redis-server not found in PATH: install Redis 7 (apt-get install redis-server)")
		}
		t.Skip("starts a redis-server of its own, and none is in PATH (apt-get install redis-server)")
	}
	return bin
}

// connect returns a client of the shared server. With its variable unset
// the test skips at once, before any dial (the quick command needs nothing
// installed), except in strict mode, where the default address must answer.
func connect(t *testing.T) *goredis.Client {
	t.Helper()
	addr := os.Getenv(addrEnv)
	if addr == "" {
		if !strict() {
			t.Skipf("needs Redis: set %s (e.g. %s) to run it", addrEnv, defaultAddr)
		}
		addr = defaultAddr
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		brokerMissing(t, "Redis is unreachable at %s: %v", addr, err)
	}
	return rdb
}

// newKey returns a stream key of this test's own, deleted afterwards.
func newKey(t *testing.T, rdb *goredis.Client) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	key := "outbox-test:" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rdb.Del(ctx, key).Err(); err != nil {
			t.Errorf("delete %s: %v", key, err)
		}
	})
	return key
}

// openDB returns a SQLite database with the outbox plugin installed.
func openDB(t *testing.T) (*gorm.DB, *outbox.Outbox) {
	return outboxtest.SQLite(t, outbox.Config{})
}

func record(t *testing.T, db *gorm.DB, id string) outbox.Row {
	t.Helper()
	return outboxtest.Row(t, db, id)
}

// server is a redis-server owned by one test, so that the test can stop it
// without disturbing the others. It keeps an append-only file in its own
// directory so that a stopped server comes back with its streams.
type server struct {
	t    testing.TB
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func newServer(t testing.TB) *server {
	t.Helper()
	s := &server{t: t, bin: redisBinary(t), port: freePort(t), dir: t.TempDir()}
	t.Cleanup(s.stop)
	s.start()
	return s
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *server) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no")
	require.NoError(s.t, cmd.Start())
	s.cmd, s.done = cmd, make(chan struct{})
	done := s.done
	go func() { _ = cmd.Wait(); close(done) }()
	require.Eventually(s.t, func() bool {
		select {
		case <-done:
			return true // reported below
		default:
		}
		c, err := net.DialTimeout("tcp", s.addr(), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 15*time.Second, 20*time.Millisecond, "redis-server did not start listening")
	select {
	case <-done:
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		s.t.Fatalf("redis-server exited at start:\n%s", log)
	default:
	}
}

// stop shuts the server down (SIGTERM: it syncs the append-only file) and
// waits for it to exit.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
