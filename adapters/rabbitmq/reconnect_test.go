package rabbitmq

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
)

// TestReopenAfterConnectionCut cuts the publisher's connection from under
// it, between two publishes: the next publish must reopen it transparently.
func TestReopenAfterConnectionCut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("#")
	p := f.publisher(Config{})

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-before")))
	old := p.conn()
	require.NoError(t, old.Close())

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-after")))
	assert.NotSame(t, old, p.conn(), "a new connection was opened")
	receiveIDs(t, d, "evt-before", "evt-after")
}

// TestReopenAfterChannelError makes the broker close the channel (publishing
// to a missing exchange is a channel error): the publish fails, and once the
// exchange exists the next publish works on a fresh channel.
func TestReopenAfterChannelError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	missing := randomName("outbox-test-missing-")
	p := f.publisher(Config{Exchange: missing})

	err := p.Publish(t.Context(), testEvent("evt-nowhere"))
	require.ErrorIs(t, err, ErrConnectionLost)
	assert.True(t, outbox.IsUnavailable(err), "no message can reach a missing exchange: %v", err)
	var amqpErr *amqp.Error
	require.ErrorAs(t, err, &amqpErr)
	assert.Equal(t, amqp.NotFound, amqpErr.Code)

	f.admin(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(missing, amqp.ExchangeTopic, false, false, false, false, nil)
	})
	t.Cleanup(func() { f.admin(func(ch *amqp.Channel) error { return ch.ExchangeDelete(missing, false, false) }) })
	q := f.queue("unused", nil) // keeps the fixture's cleanup in charge of the queue
	f.admin(func(ch *amqp.Channel) error { return ch.QueueBind(q, "#", missing, false, nil) })
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-somewhere")))
}

// TestConnectionLostWhilePublishing cuts the connection while publishes are
// in flight. Every publish must end (no hang), either confirmed or with
// ErrConnectionLost, and every confirmed event must reach the queue.
func TestConnectionLostWhilePublishing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("#")
	p := f.publisher(Config{})
	require.NoError(t, p.Connect(t.Context()))
	old := p.conn()

	const workers, each = 4, 50
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		confirmed []string
		lost      int
		started   = make(chan struct{})
		startOnce sync.Once
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("evt-%d-%d", w, i)
				err := p.Publish(t.Context(), testEvent(id))
				startOnce.Do(func() { close(started) })
				mu.Lock()
				switch {
				case err == nil:
					confirmed = append(confirmed, id)
				case errors.Is(err, ErrConnectionLost):
					lost++
					if !outbox.IsUnavailable(err) {
						t.Errorf("publish %s: a lost connection must be Unavailable: %v", id, err)
					}
				default:
					t.Errorf("publish %s: unexpected error %v", id, err)
				}
				mu.Unlock()
			}
		})
	}
	<-started
	require.NoError(t, old.Close())
	wg.Wait()

	t.Logf("confirmed %d, lost in flight %d", len(confirmed), lost)
	require.NotEmpty(t, confirmed)
	// Every confirmed event is in the queue; receiveIDs fails otherwise.
	receiveIDs(t, d, confirmed...)
}

// TestBrokerForcedClose closes the publisher's connection from the broker,
// with the same CONNECTION_FORCED a broker restart sends. It needs
// rabbitmqctl, which CI has next to the broker.
func TestBrokerForcedClose(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		toolMissing(t, "rabbitmqctl not in PATH (it comes with rabbitmq-server); TestReopenAfterConnectionCut covers the client side")
	}
	d := f.consume("#")
	name := randomName("outbox-test-forced-")
	p := f.publisher(Config{ConnectionName: name})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-before")))
	closed := p.conn().NotifyClose(make(chan *amqp.Error, 1))

	out, err := exec.CommandContext(t.Context(), ctl, "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var pid string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, `"`+name+`"`) {
			pid = strings.Fields(line)[0]
		}
	}
	require.NotEmpty(t, pid, "connection %s not listed by rabbitmqctl:\n%s", name, out)
	out, err = exec.CommandContext(t.Context(), ctl, "-q", "close_connection", pid, "simulated broker restart").CombinedOutput()
	require.NoError(t, err, "%s", out)

	select {
	case e := <-closed:
		require.NotNil(t, e)
		assert.Equal(t, amqp.ConnectionForced, e.Code)
	case <-time.After(10 * time.Second):
		t.Fatal("the broker did not close the connection")
	}

	// The publisher notices on its own; the next publish reconnects.
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-after")))
	receiveIDs(t, d, "evt-before", "evt-after")
}
