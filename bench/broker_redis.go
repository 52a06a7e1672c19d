package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/wire"
	goredis "github.com/redis/go-redis/v9"
)

// redisFloorPipeline is how many XADDs the pipelined floor sends per
// pipeline, one pipeline after the other.
const redisFloorPipeline = 1000

// redisBroker is the Redis of OUTBOX_TEST_REDIS_ADDR. Every measurement
// appends to a stream key of its own, deleted after it.
type redisBroker struct {
	addr    string
	version string
	rdb     *goredis.Client // counts and deletes
}

func newRedisBroker(ctx context.Context, addr string) (*redisBroker, error) {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rdb.Info(pctx, "server").Result()
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("%s is set but Redis does not answer: %w", redisAddrEnv, err)
	}
	var v string
	for _, l := range strings.Split(info, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			v = s
		}
	}
	return &redisBroker{addr: addr, version: v, rdb: rdb}, nil
}

func (b *redisBroker) label() string { return "Redis " + b.version }

func (b *redisBroker) close() { _ = b.rdb.Close() }

func (b *redisBroker) fresh(context.Context) (brokerDest, error) {
	return &redisDest{b: b, key: "outbox:bench:" + randHex(4)}, nil
}

type redisDest struct {
	b       *redisBroker
	key     string
	clients []*goredis.Client
}

func (d *redisDest) client() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: d.b.addr})
	d.clients = append(d.clients, c)
	return c
}

// args are the adapter's XADDs of evs (redis.go: nativeEntry): the Field
// constants' fields, in that order, "headers" "{}" for an event without
// headers.
func (d *redisDest) args(evs []outbox.Event) []*goredis.XAddArgs {
	out := make([]*goredis.XAddArgs, len(evs))
	for i, e := range evs {
		payload, err := e.PayloadJSON()
		if err != nil {
			panic(err)
		}
		headers := []byte("{}")
		if len(e.Headers) > 0 {
			headers, _ = json.Marshal(e.Headers)
		}
		out[i] = &goredis.XAddArgs{Stream: d.key, ID: "*", Values: []any{
			outboxredis.FieldID, e.ID,
			outboxredis.FieldType, e.Type,
			outboxredis.FieldAggregateType, e.AggregateType,
			outboxredis.FieldAggregateID, e.AggregateID,
			outboxredis.FieldIdempotencyKey, e.IdempotencyKey,
			outboxredis.FieldOccurredAt, e.OccurredAt.UTC().Format(wire.TimeFormat),
			outboxredis.FieldHeaders, string(headers),
			outboxredis.FieldPayload, string(payload),
		}}
	}
	return out
}

func (d *redisDest) floorAsync(ctx context.Context, evs []outbox.Event) (func(context.Context) error, error) {
	c := d.client()
	if err := c.Ping(ctx).Err(); err != nil { // a connection in the pool
		return nil, err
	}
	args := d.args(evs)
	return func(ctx context.Context) error {
		for lo := 0; lo < len(args); lo += redisFloorPipeline {
			pipe := c.Pipeline()
			for _, a := range args[lo:min(lo+redisFloorPipeline, len(args))] {
				pipe.XAdd(ctx, a)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func (d *redisDest) floorSync(ctx context.Context, evs []outbox.Event, goroutines int) (func(context.Context) error, error) {
	c := d.client()
	if err := c.Ping(ctx).Err(); err != nil {
		return nil, err
	}
	args := d.args(evs)
	return func(ctx context.Context) error {
		return syncFloor(ctx, len(args), goroutines, func(ctx context.Context, i int) error {
			return c.XAdd(ctx, args[i]).Err()
		})
	}, nil
}

func (d *redisDest) adapter(ctx context.Context) (outbox.Handler, outbox.AsyncHandler, func(), error) {
	c := d.client()
	if err := c.Ping(ctx).Err(); err != nil {
		return nil, nil, nil, err
	}
	p, err := outboxredis.New(c, outboxredis.Config{Stream: d.key})
	if err != nil {
		return nil, nil, nil, err
	}
	return p.Handler(), p.AsyncHandler(), func() {}, nil
}

func (d *redisDest) stored(ctx context.Context) (int64, error) {
	return d.b.rdb.XLen(ctx, d.key).Result()
}

func (d *redisDest) remove(ctx context.Context) error {
	for _, c := range d.clients {
		_ = c.Close()
	}
	return d.b.rdb.Del(ctx, d.key).Err()
}
