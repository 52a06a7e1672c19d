package nats_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

const (
	urlEnv     = "OUTBOX_TEST_NATS_URL"
	defaultURL = "nats://127.0.0.1:4222"
	fullEnv    = "OUTBOX_TEST_FULL"
	startCmd   = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log"
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

// brokerURL is the shared server's address. Unset, the test skips at once
// (the quick command needs nothing installed), except in strict mode,
// where the default address must answer.
func brokerURL(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(urlEnv); url != "" {
		return url
	}
	if !strict() {
		t.Skipf("needs NATS with JetStream: set %s (e.g. %s) to run it", urlEnv, defaultURL)
	}
	return defaultURL
}

// brokerMissing fails the test: the broker was asked for (its variable is
// set, or the run is strict), so a skip would hide a broken set-up.
func brokerMissing(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Fatalf(format+"\nstart it with:\n  %s", append(args, startCmd)...)
}

// serverBinary is the nats-server binary for a test that starts servers
// of its own. Missing, it fails the test in strict mode and skips it
// otherwise.
func serverBinary(t *testing.T) string {
	t.Helper()
	if bin, err := exec.LookPath("nats-server"); err == nil {
		return bin
	}
	bin := "/usr/sbin/nats-server"
	if _, err := os.Stat(bin); err != nil {
		if strict() {
			t.Fatalf("nats-server binary not found in PATH or at %s: apt-get install nats-server", bin)
		}
		t.Skip("starts a nats-server of its own, and none is installed (apt-get install nats-server)")
	}
	return bin
}

// connect returns a JetStream context on the shared server.
func connect(t testing.TB) (*natsgo.Conn, jetstream.JetStream) {
	t.Helper()
	url := brokerURL(t)
	nc, err := natsgo.Connect(url, natsgo.Timeout(2*time.Second), natsgo.Name(t.Name()))
	if err != nil {
		brokerMissing(t, "NATS is unreachable at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := t.Context()
	if _, err := js.AccountInfo(ctx); err != nil {
		brokerMissing(t, "NATS at %s has no JetStream (start it with -js): %v", url, err)
	}
	return nc, js
}

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// keepAlive is an empty file stream that stays on the test server. Without
// one, nats-server (2.9) removes the account's streams directory when the
// last stream is deleted, and a stream that a parallel test creates at that
// moment fails ("error creating store for stream", 10049).
const keepAlive = "OUTBOX_TEST_KEEPALIVE"

var keepAliveOnce sync.Once

// newStream creates a stream of its own for one test, bound to
// "<prefix>.>", and returns it with the prefix.
func newStream(t testing.TB, js jetstream.JetStream) (jetstream.Stream, string) {
	t.Helper()
	keepAliveOnce.Do(func() {
		_, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{
			Name: keepAlive, Subjects: []string{"outboxtest_keepalive.none"}, Storage: jetstream.FileStorage,
		})
		require.NoError(t, err)
	})
	id := randomName()
	name, prefix := "OUTBOX_TEST_"+strings.ToUpper(id), "outboxtest_"+id
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{prefix + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := contextTimeout(5 * time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return s, prefix
}

// openDB returns a SQLite database with the outbox plugin installed.
func openDB(t *testing.T) (*gorm.DB, *outbox.Outbox) {
	return outboxtest.SQLite(t, outbox.Config{})
}

func status(t *testing.T, db *gorm.DB, id string) outbox.Status {
	t.Helper()
	return outboxtest.Row(t, db, id).Status
}

// server is a nats-server owned by one test, so that the test can stop it
// without disturbing the others.
type server struct {
	t    *testing.T
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func newServer(t *testing.T) *server {
	t.Helper()
	bin := serverBinary(t)
	s := &server{t: t, bin: bin, port: freePort(t), dir: t.TempDir()}
	t.Cleanup(s.stop)
	s.start()
	return s
}

func (s *server) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

func (s *server) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js",
		"-sd", filepath.Join(s.dir, "store"), "-l", filepath.Join(s.dir, "server.log"))
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
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 15*time.Second, 20*time.Millisecond, "nats-server did not start listening")
	select {
	case <-done:
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		s.t.Fatalf("nats-server exited at start:\n%s", log)
	default:
	}
}

// pause freezes the server (SIGSTOP): clients stay connected and their
// writes fill the socket, but nothing is read or answered until resume.
// It returns once every thread of the server has stopped: the signal
// stops each thread as it next enters the kernel, and on a loaded machine
// a thread that had not yet stored and acknowledged a publish sent just
// after the signal did (a test saw a real ack, sequence 1, from a server
// that was paused before the publish).
func (s *server) pause() {
	require.NoError(s.t, s.cmd.Process.Signal(syscall.SIGSTOP))
	tasks := "/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/task"
	require.Eventually(s.t, func() bool {
		ids, err := os.ReadDir(tasks)
		if err != nil {
			return false
		}
		for _, id := range ids {
			stat, err := os.ReadFile(tasks + "/" + id.Name() + "/stat")
			if err != nil {
				return false
			}
			// The state follows the command's closing parenthesis.
			f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(f) == 0 || (f[0] != "T" && f[0] != "t") {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "nats-server did not stop on SIGSTOP")
}

// resume undoes pause.
func (s *server) resume() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// kill SIGKILLs the server (paused or not) and waits for it to exit: its
// clients' connections drop at once.
func (s *server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// stop shuts the server down gracefully and waits for it to exit.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	s.resume() // a paused server takes the SIGTERM once it runs again
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
