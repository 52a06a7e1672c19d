package main

import (
	"context"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxrabbitmq "github.com/gorm-outbox/outbox/adapters/rabbitmq"
	"github.com/gorm-outbox/outbox/wire"
	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitBroker is the RabbitMQ of OUTBOX_TEST_RABBITMQ_URL. Every
// measurement has an exchange and a queue of its own (a durable topic
// exchange, a durable classic queue bound to it with "#"), deleted after it.
type rabbitBroker struct {
	url     string
	version string
	conn    *amqp.Connection // declares and deletes
	ch      *amqp.Channel
}

func newRabbitBroker(_ context.Context, url string) (*rabbitBroker, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("%s is set but RabbitMQ does not answer: %w", rabbitmqURLEnv, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	v, _ := conn.Properties["version"].(string)
	return &rabbitBroker{url: url, version: v, conn: conn, ch: ch}, nil
}

func (b *rabbitBroker) label() string { return "RabbitMQ " + b.version }

func (b *rabbitBroker) close() { _ = b.conn.Close() }

func (b *rabbitBroker) fresh(context.Context) (brokerDest, error) {
	name := "outbox.bench." + randHex(4)
	if err := b.ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange: %w", err)
	}
	if _, err := b.ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		return nil, fmt.Errorf("declare queue: %w", err)
	}
	if err := b.ch.QueueBind(name, "#", name, false, nil); err != nil {
		return nil, fmt.Errorf("bind queue: %w", err)
	}
	return &rabbitDest{b: b, name: name}, nil
}

type rabbitDest struct {
	b     *rabbitBroker
	name  string // of the exchange and the queue
	conns []*amqp.Connection
}

// channel is a confirm-mode channel on a connection of the measurement's
// own, as the adapter's session has.
func (d *rabbitDest) channel() (*amqp.Channel, error) {
	conn, err := amqp.Dial(d.b.url)
	if err != nil {
		return nil, err
	}
	d.conns = append(d.conns, conn)
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	// The adapter listens for returns (its messages are mandatory); so does
	// the floor, though none comes: the queue is bound.
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	go func() {
		for range returns {
		}
	}()
	return ch, ch.Confirm(false)
}

// msgs are the adapter's messages of evs (message.go: Publisher.message in
// Native format): the Outbox-* headers, the properties, persistent.
func (d *rabbitDest) msgs(evs []outbox.Event) []amqp.Publishing {
	out := make([]amqp.Publishing, len(evs))
	for i, e := range evs {
		m := nativeMessage(wire.AMQPBinding, e)
		t := make(amqp.Table, len(m.Header))
		for _, h := range m.Header {
			t[h.Name] = h.Value
		}
		out[i] = amqp.Publishing{
			Headers: t, ContentType: m.ContentType, DeliveryMode: amqp.Persistent,
			MessageId: e.ID, Timestamp: e.OccurredAt, Type: e.Type, Body: m.Body,
		}
	}
	return out
}

// floorAsync: every message published (mandatory, as the adapter's) on one
// confirm-mode channel, then every confirm awaited.
func (d *rabbitDest) floorAsync(_ context.Context, evs []outbox.Event) (func(context.Context) error, error) {
	ch, err := d.channel()
	if err != nil {
		return nil, err
	}
	msgs := d.msgs(evs)
	return func(ctx context.Context) error {
		dcs := make([]*amqp.DeferredConfirmation, len(msgs))
		for i, m := range msgs {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, d.name, m.Type, true, false, m)
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			dcs[i] = dc
		}
		for _, dc := range dcs {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("nacked")
			}
		}
		return nil
	}, nil
}

// floorSync: goroutines sharing one confirm-mode channel, as the
// adapter's Handler does, each awaiting its message's confirm before its
// next publish.
func (d *rabbitDest) floorSync(_ context.Context, evs []outbox.Event, goroutines int) (func(context.Context) error, error) {
	ch, err := d.channel()
	if err != nil {
		return nil, err
	}
	msgs := d.msgs(evs)
	return func(ctx context.Context) error {
		return syncFloor(ctx, len(msgs), goroutines, func(ctx context.Context, i int) error {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, d.name, msgs[i].Type, true, false, msgs[i])
			if err != nil {
				return err
			}
			ok, err := dc.WaitContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("nacked")
			}
			return err
		})
	}, nil
}

func (d *rabbitDest) adapter(ctx context.Context) (outbox.Handler, outbox.AsyncHandler, func(), error) {
	p, err := outboxrabbitmq.New(outboxrabbitmq.Config{URL: d.b.url, Exchange: d.name, ConnectionName: "outbox-bench"})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, nil, nil, err
	}
	return p.Handler(), p.AsyncHandler(), func() { _ = p.Close() }, nil
}

func (d *rabbitDest) stored(context.Context) (int64, error) {
	q, err := d.b.ch.QueueDeclarePassive(d.name, true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	if err != nil {
		return 0, err
	}
	return int64(q.Messages), nil
}

func (d *rabbitDest) remove(context.Context) error {
	for _, c := range d.conns {
		_ = c.Close()
	}
	if _, err := d.b.ch.QueueDelete(d.name, false, false, false); err != nil {
		return err
	}
	return d.b.ch.ExchangeDelete(d.name, false, false)
}
