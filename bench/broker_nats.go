package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsBroker is the NATS server of OUTBOX_TEST_NATS_URL. It may be shared
// (other tests use it), so every measurement has a stream of its own, on
// subjects of its own, with file storage, deleted after it.
type natsBroker struct {
	url     string
	version string
	nc      *natsgo.Conn // creates and deletes the streams
	js      jetstream.JetStream
	prefix  string // outboxbench.<random>.
	n       int
}

func newNATSBroker(ctx context.Context, url string) (*natsBroker, error) {
	nc, err := natsgo.Connect(url, natsgo.Timeout(5*time.Second), natsgo.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("%s is set but NATS does not answer: %w", natsURLEnv, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ictx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("NATS at %s has no working JetStream: %w", url, err)
	}
	return &natsBroker{url: url, version: nc.ConnectedServerVersion(), nc: nc, js: js, prefix: "outboxbench." + randHex(4) + "."}, nil
}

func (b *natsBroker) label() string { return "NATS JetStream " + b.version }

func (b *natsBroker) close() { b.nc.Close() }

func (b *natsBroker) fresh(ctx context.Context) (brokerDest, error) {
	b.n++
	prefix := fmt.Sprintf("%s%d.", b.prefix, b.n)
	name := strings.ReplaceAll(strings.TrimSuffix(prefix, "."), ".", "_")
	s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{prefix + ">"},
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	return &natsDest{b: b, name: name, prefix: prefix, stream: s}, nil
}

type natsDest struct {
	b      *natsBroker
	name   string
	prefix string // the subject is prefix + event type, as the adapter's SubjectPrefix
	stream jetstream.Stream
	conns  []*natsgo.Conn
}

// conn is a connection of the measurement's own, as an application's
// relay process would have.
func (d *natsDest) conn() (*natsgo.Conn, error) {
	nc, err := natsgo.Connect(d.b.url, natsgo.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	d.conns = append(d.conns, nc)
	return nc, nil
}

// msgs are the adapter's messages of evs (nats.go: Publisher.message in
// Native format): the Outbox-* headers, Content-Type, and the payload;
// Nats-Msg-Id is the publish option jetstream.WithMsgID(e.ID), as there.
func (d *natsDest) msgs(evs []outbox.Event) []*natsgo.Msg {
	out := make([]*natsgo.Msg, len(evs))
	for i, e := range evs {
		m := nativeMessage(wire.NATSBinding, e)
		h := make(natsgo.Header, len(m.Header)+2)
		for _, a := range m.Header {
			h.Set(a.Name, a.Value)
		}
		h.Set(outboxnats.HeaderContentType, m.ContentType)
		out[i] = &natsgo.Msg{Subject: d.prefix + e.Type, Data: m.Body, Header: h}
	}
	return out
}

func (d *natsDest) floorAsync(_ context.Context, evs []outbox.Event) (func(context.Context) error, error) {
	nc, err := d.conn()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc) // nats.go's defaults: 4000 pending at most
	if err != nil {
		return nil, err
	}
	msgs := d.msgs(evs)
	return func(ctx context.Context) error {
		futs := make([]jetstream.PubAckFuture, len(msgs))
		awaited := 0 // futs below it are acknowledged
		await := func() error {
			select {
			case <-futs[awaited].Ok():
			case err := <-futs[awaited].Err():
				return fmt.Errorf("publish ack: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
			awaited++
			return nil
		}
		for i, m := range msgs {
			for {
				f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(evs[i].ID))
				if err == nil {
					futs[i] = f
					break
				}
				// nats.go gives up on a publish that found its 4000
				// pending full for 200 ms (a slow moment of the server's):
				// a client waits for the oldest ack and publishes again.
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || awaited == i {
					return fmt.Errorf("publish async: %w", err)
				}
				if err := await(); err != nil {
					return err
				}
			}
		}
		for awaited < len(futs) {
			if err := await(); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func (d *natsDest) floorSync(_ context.Context, evs []outbox.Event, goroutines int) (func(context.Context) error, error) {
	nc, err := d.conn()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	msgs := d.msgs(evs)
	return func(ctx context.Context) error {
		return syncFloor(ctx, len(msgs), goroutines, func(ctx context.Context, i int) error {
			_, err := js.PublishMsg(ctx, msgs[i], jetstream.WithMsgID(evs[i].ID))
			return err
		})
	}, nil
}

func (d *natsDest) adapter(context.Context) (outbox.Handler, outbox.AsyncHandler, func(), error) {
	nc, err := d.conn()
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err := outboxnats.New(js, outboxnats.Config{SubjectPrefix: d.prefix, Logger: warnLogger})
	if err != nil {
		return nil, nil, nil, err
	}
	return p.Handler(), p.AsyncHandler(), func() {}, nil
}

func (d *natsDest) stored(ctx context.Context) (int64, error) {
	info, err := d.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.State.Msgs), nil
}

func (d *natsDest) remove(ctx context.Context) error {
	for _, nc := range d.conns {
		nc.Close()
	}
	return d.b.js.DeleteStream(ctx, d.name)
}
