package rabbitmq

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

const (
	urlEnv     = "OUTBOX_TEST_RABBITMQ_URL"
	defaultURL = "amqp://guest:guest@127.0.0.1:5672/"
	fullEnv    = "OUTBOX_TEST_FULL"
	startCmd   = "rabbitmq-server -detached   # then wait for 127.0.0.1:5672 (about 10 s)"
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

// testURL is the shared broker's address. Unset, the test skips at once
// (the quick command needs nothing installed), except in strict mode,
// where the default address must answer.
func testURL(t *testing.T) string {
	t.Helper()
	if u := os.Getenv(urlEnv); u != "" {
		return u
	}
	if !strict() {
		t.Skipf("needs RabbitMQ: set %s (e.g. %s) to run it", urlEnv, defaultURL)
	}
	return defaultURL
}

// brokerMissing fails the test: the broker was asked for (its variable is
// set, or the run is strict), so a skip would hide a broken set-up.
func brokerMissing(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf(format+"\nstart it with:\n  %s", append(args, startCmd)...)
}

// toolMissing fails the test in strict mode, where the broker's tools are
// installed with it, and skips it otherwise.
func toolMissing(t *testing.T, format string, args ...any) {
	t.Helper()
	if strict() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// fixture is one test's corner of the shared broker: an exchange of its
// own, the queues it binds, all deleted when the test ends.
type fixture struct {
	t        *testing.T
	url      string
	conn     *amqp.Connection // the test's own connection, for setup and consuming
	ch       *amqp.Channel
	exchange string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	url := testURL(t)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		brokerMissing(t, "RabbitMQ is unreachable at %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	f := &fixture{t: t, url: url, conn: conn, ch: ch, exchange: randomName("outbox-test-")}
	require.NoError(t, ch.ExchangeDeclare(f.exchange, amqp.ExchangeTopic, false, false, false, false, nil))
	t.Cleanup(func() { f.admin(func(ch *amqp.Channel) error { return ch.ExchangeDelete(f.exchange, false, false) }) })
	return f
}

// admin runs fn on a fresh channel: a failed declaration closes its
// channel, and cleanup must not depend on the state a test left behind.
func (f *fixture) admin(fn func(*amqp.Channel) error) {
	f.t.Helper()
	ch, err := f.conn.Channel()
	require.NoError(f.t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(f.t, fn(ch))
}

// queue declares a queue bound to the fixture's exchange with the binding
// key and returns its name; it is deleted when the test ends.
func (f *fixture) queue(bindingKey string, args amqp.Table) string {
	f.t.Helper()
	name := randomName("outbox-test-q-")
	_, err := f.ch.QueueDeclare(name, false, false, false, false, args)
	require.NoError(f.t, err)
	f.t.Cleanup(func() {
		f.admin(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err })
	})
	require.NoError(f.t, f.ch.QueueBind(name, bindingKey, f.exchange, false, nil))
	return name
}

// consume binds a new queue and returns its deliveries.
func (f *fixture) consume(bindingKey string) <-chan amqp.Delivery {
	f.t.Helper()
	q := f.queue(bindingKey, nil)
	ch, err := f.conn.Channel()
	require.NoError(f.t, err)
	d, err := ch.Consume(q, "", true, true, false, false, nil)
	require.NoError(f.t, err)
	return d
}

// publisher returns a Publisher on the fixture's exchange, closed when the
// test ends.
func (f *fixture) publisher(cfg Config) *Publisher {
	f.t.Helper()
	if cfg.URL == "" {
		cfg.URL = f.url
	}
	if cfg.Exchange == "" {
		cfg.Exchange = f.exchange
	}
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = randomName("outbox-test-conn-")
	}
	p, err := New(cfg)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = p.Close() })
	return p
}

// receive returns the next delivery, failing the test after a deadline.
func receive(t *testing.T, d <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case m, ok := <-d:
		require.True(t, ok, "consumer channel closed")
		return m
	case <-timer.C:
		t.Fatal("no message within 10s")
		return amqp.Delivery{}
	}
}

// receiveIDs collects messages until every one of ids has arrived and
// returns how often each ID was seen: at least once delivery allows
// repeats, and messages whose publish failed may arrive too.
func receiveIDs(t *testing.T, d <-chan amqp.Delivery, ids ...string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	missing := len(ids)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for missing > 0 {
		m := receive(t, d)
		if want[m.MessageId] && seen[m.MessageId] == 0 {
			missing--
		}
		seen[m.MessageId]++
	}
	return seen
}

// conn returns the publisher's current connection: the hook through which
// tests cut it as a broker restart would.
func (p *Publisher) conn() *amqp.Connection {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == nil {
		return nil
	}
	return p.sess.conn
}

// outage makes the publisher's dials fail while down is set, as they would
// while the broker is stopped.
type outage struct{ down atomic.Bool }

func (o *outage) dial(network, addr string) (net.Conn, error) {
	if o.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused (simulated outage)")}
	}
	return amqp.DefaultDial(3*time.Second)(network, addr)
}

func amqpConfigWithDial(dial func(network, addr string) (net.Conn, error)) amqp.Config {
	return amqp.Config{Dial: dial}
}
