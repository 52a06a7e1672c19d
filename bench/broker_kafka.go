package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/gorm-outbox/outbox"
	outboxkafka "github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/wire"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaPartitions is the partitions of the topic, as in the adapter's
// tests; the record key (the aggregate ID) spreads the events over them.
const kafkaPartitions = 3

// kafkaBroker is franz-go's in-process fake cluster (kfake), as in the
// adapter's tests: a cluster per measurement, with its one topic, closed
// after it. It runs in this process, so it shares its CPU with the client
// and the relay.
type kafkaBroker struct{}

func newKafkaBroker() (*kafkaBroker, error) { return &kafkaBroker{}, nil }

func (b *kafkaBroker) label() string { return "Kafka (kfake, in process)" }

func (b *kafkaBroker) close() {}

func (b *kafkaBroker) fresh(context.Context) (brokerDest, error) {
	topic := "outbox.bench." + randHex(4)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaPartitions, topic))
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	return &kafkaDest{c: c, topic: topic}, nil
}

type kafkaDest struct {
	c       *kfake.Cluster
	topic   string
	clients []*kgo.Client
}

func (d *kafkaDest) client(opts ...kgo.Opt) (*kgo.Client, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(d.c.ListenAddrs()...)}, opts...)...)
	if err != nil {
		return nil, err
	}
	d.clients = append(d.clients, cl)
	return cl, nil
}

// records are the adapter's records of evs (kafka.go: Producer.record in
// Native format): key the aggregate ID, the Outbox-* headers then
// Content-Type, the payload as the value.
func (d *kafkaDest) records(evs []outbox.Event) []*kgo.Record {
	out := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		m := nativeMessage(wire.KafkaBinding, e)
		h := make([]kgo.RecordHeader, 0, len(m.Header)+1)
		for _, a := range m.Header {
			if !strings.EqualFold(a.Name, outboxkafka.HeaderContentType) {
				h = append(h, kgo.RecordHeader{Key: a.Name, Value: []byte(a.Value)})
			}
		}
		h = append(h, kgo.RecordHeader{Key: outboxkafka.HeaderContentType, Value: []byte(m.ContentType)})
		out[i] = &kgo.Record{Topic: d.topic, Key: []byte(e.AggregateID), Value: m.Body, Headers: h}
	}
	return out
}

// floorAsync: a client at franz-go's defaults (idempotent, 10 ms linger,
// which Flush cuts short), every record produced, then Flush, every
// promise checked.
func (d *kafkaDest) floorAsync(_ context.Context, evs []outbox.Event) (func(context.Context) error, error) {
	cl, err := d.client()
	if err != nil {
		return nil, err
	}
	recs := d.records(evs)
	return func(ctx context.Context) error {
		errc := make(chan error, 1)
		for _, r := range recs {
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
				if err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			})
		}
		if err := cl.Flush(ctx); err != nil {
			return err
		}
		select {
		case err := <-errc:
			return fmt.Errorf("produce: %w", err)
		default:
		}
		return nil
	}, nil
}

// floorSync: ProduceSync, one record at a time per goroutine, on a client
// without linger, as the adapter's.
func (d *kafkaDest) floorSync(_ context.Context, evs []outbox.Event, goroutines int) (func(context.Context) error, error) {
	cl, err := d.client(kgo.ProducerLinger(0))
	if err != nil {
		return nil, err
	}
	recs := d.records(evs)
	return func(ctx context.Context) error {
		return syncFloor(ctx, len(recs), goroutines, func(ctx context.Context, i int) error {
			return cl.ProduceSync(ctx, recs[i]).FirstErr()
		})
	}, nil
}

func (d *kafkaDest) adapter(context.Context) (outbox.Handler, outbox.AsyncHandler, func(), error) {
	p, err := outboxkafka.New(outboxkafka.Config{SeedBrokers: d.c.ListenAddrs(), Topic: d.topic})
	if err != nil {
		return nil, nil, nil, err
	}
	return p.Handler(), p.AsyncHandler(), p.Close, nil
}

func (d *kafkaDest) stored(context.Context) (int64, error) {
	var n int64
	for _, p := range d.c.PartitionInfos(d.topic) {
		n += p.HighWatermark - p.LogStartOffset
	}
	return n, nil
}

func (d *kafkaDest) remove(context.Context) error {
	for _, cl := range d.clients {
		cl.Close()
	}
	d.c.Close()
	return nil
}
