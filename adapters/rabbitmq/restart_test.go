package rabbitmq

import (
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/outagetest"
)

// serverEnv names the rabbitmq-server script the restart test runs; by
// default the one Debian installs under /usr/lib/rabbitmq/bin (the wrapper
// in /usr/sbin switches to the rabbitmq user, who cannot use the test's
// directory).
const serverEnv = "OUTBOX_TEST_RABBITMQ_SERVER"

// node is a RabbitMQ node owned by one test, on ports of its own, with its
// data in the test's directory, so that the test can stop and restart it
// without disturbing the shared broker.
type node struct {
	t          *testing.T
	bin, dir   string
	name       string
	port, dist int
	cmd        *exec.Cmd
	done       chan struct{}
}

func newNode(t *testing.T) *node {
	t.Helper()
	bin := os.Getenv(serverEnv)
	if bin == "" {
		bin = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	}
	if _, err := os.Stat(bin); err != nil {
		toolMissing(t, "starts a RabbitMQ node of its own: rabbitmq-server script not found at %s (apt-get install rabbitmq-server, or set %s)", bin, serverEnv)
	}
	n := &node{t: t, bin: bin, dir: t.TempDir(), name: randomName("outboxtest-") + "@localhost", port: freePort(t), dist: freePort(t)}
	for file, content := range map[string]string{
		"rabbitmq.conf":   "listeners.tcp.1 = 127.0.0.1:" + strconv.Itoa(n.port) + "\n",
		"enabled_plugins": "[].\n",
		"rabbitmq-env":    "", // instead of /etc/rabbitmq/rabbitmq-env.conf, which names the shared node
	} {
		require.NoError(t, os.WriteFile(filepath.Join(n.dir, file), []byte(content), 0o600))
	}
	t.Cleanup(n.stop)
	return n
}

func (n *node) url() string { return "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(n.port) + "/" }

// start starts the node and waits until it accepts AMQP connections.
func (n *node) start() {
	n.t.Helper()
	cmd := exec.Command(n.bin)
	cmd.Env = append(os.Environ(),
		"HOME="+n.dir, // the Erlang cookie
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(n.dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.dir, "rabbitmq-env"),
		"RABBITMQ_PID_FILE="+filepath.Join(n.dir, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	out, err := os.OpenFile(filepath.Join(n.dir, "out.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(n.t, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // stop signals the script and the Erlang VM
	require.NoError(n.t, cmd.Start())
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); close(done) }()

	deadline := time.Now().Add(120 * time.Second)
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(n.dir, "out.log"))
			n.t.Fatalf("rabbitmq-server exited at start:\n%s", log)
		default:
		}
		c, err := amqp.DialConfig(n.url(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("RabbitMQ node %s did not accept connections within 120 s: %v", n.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop shuts the node down (SIGTERM: a clean shutdown, which closes client
// connections with CONNECTION_FORCED as a restart does) and waits for it.
func (n *node) stop() {
	if n.cmd == nil {
		return
	}
	pgid := n.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-n.done
	}
	n.cmd = nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drainQueue reads every message of queue and counts them by message ID.
func drainQueue(t *testing.T, url, queue string) map[string]int {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	seen := map[string]int{}
	for {
		m, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return seen
		}
		seen[m.MessageId]++
	}
}

// TestBrokerRestart restarts a RabbitMQ node of the test's own under a
// steady writer and a running relay: a clean shutdown (the broker closes
// the publisher's connection with CONNECTION_FORCED), a pause, and a start
// from the same data directory, about 15 s in all. Nothing is lost or
// failed, no attempt is spent on the outage (every event is sent at its
// first counted attempt), and the relay logs "destination unavailable"
// once instead of a warning per event. Messages confirmed twice (a confirm
// the restart swallowed) are allowed: at least once.
func TestBrokerRestart(t *testing.T) {
	long(t, "a RabbitMQ node of its own, about 15 s per start, restarted under load")
	t.Parallel()
	n := newNode(t)
	n.start()
	const queue = "outbox-restart"
	func() {
		conn, err := amqp.Dial(n.url())
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.ExchangeDeclare(DefaultExchange, amqp.ExchangeTopic, true, false, false, false, nil))
		_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.QueueBind(queue, "#", DefaultExchange, false, nil))
	}()

	p, err := New(Config{URL: n.url(), DeclareExchange: true, ConnectionName: randomName("outbox-test-restart-")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	r := outagetest.NewRig(t, "outbox/rabbitmq:", "restart", 10*time.Millisecond, func(*slog.Logger) outbox.Handler { return p.Handler() })

	waitFor(t, 60*time.Second, "deliveries before the restart", func() bool { return r.Statuses()[outbox.StatusSent] >= 20 })
	began := time.Now()
	n.stop()
	time.Sleep(2 * time.Second) // down, then a start that takes its time
	n.start()
	t.Logf("broker unavailable for %v (stop, 2 s, start)", time.Since(began).Round(100*time.Millisecond))
	waitFor(t, 60*time.Second, "the relay to resume", func() bool { return r.Logs.Count(outagetest.LogResumed) == 1 })
	r.StopWriting()
	r.WaitSent(60 * time.Second)
	r.Stop()

	rep := r.Report(drainQueue(t, n.url(), queue))
	r.CheckLogs()
	assert.Zero(t, rep.Lost)
	assert.Zero(t, rep.Failed)
	assert.Equal(t, map[int]int{1: rep.Events}, rep.Attempts, "no attempt is counted for the outage")
	assert.Equal(t, 1, rep.Paused, "one \"destination unavailable\" for the restart")
	assert.Equal(t, 1, rep.Resumed)
	assert.Zero(t, rep.RetryWarnings, "no per-event warnings")
	assert.Zero(t, rep.FailedLogs)
	if t.Failed() {
		for _, rec := range r.Logs.Records() {
			if rec.Level >= slog.LevelWarn {
				t.Log(rec.Text)
			}
		}
	}
}
