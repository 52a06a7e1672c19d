package rabbitmq

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
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
	skipEnv    = "OUTBOX_SKIP_BROKERS"
	startCmd   = "rabbitmq-server -detached   # then wait for 127.0.0.1:5672 (about 10 s)"
)

// brokerMissing fails the test: a CI without its broker must go red, not
// green with every test skipped. OUTBOX_SKIP_BROKERS=1 opts out locally.
func brokerMissing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv(skipEnv) == "1" {
		t.Skipf(format+" (skipped: %s=1)", append(args, skipEnv)...)
	}
	t.Fatalf(format+"\nstart it with:\n  %s\nor set %s=1 to skip broker tests", append(args, startCmd, skipEnv)...)
}

func testURL() string {
	if u := os.Getenv(urlEnv); u != "" {
		return u
	}
	return defaultURL
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
	url := testURL()
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
