package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	skipEnv     = "OUTBOX_SKIP_BROKERS"
	startCmd    = `redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log`
)

// brokerMissing fails the test: a CI without its broker must go red, not
// green with every test skipped. OUTBOX_SKIP_BROKERS=1 opts out locally.
func brokerMissing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(skipEnv) == "1" {
		t.Skipf(format+" (skipped: %s=1)", append(args, skipEnv)...)
	}
	t.Fatalf(format+"\nstart it with:\n  %s\nor set %s=1 to skip broker tests", append(args, startCmd, skipEnv)...)
}

// connect returns a client of the shared server.
func connect(t *testing.T) *goredis.Client {
	t.Helper()
	addr := os.Getenv(addrEnv)
	if addr == "" {
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
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		brokerMissing(t, "redis-server binary not found (apt-get install redis-server)")
	}
	s := &server{t: t, bin: bin, port: freePort(t), dir: t.TempDir()}
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
