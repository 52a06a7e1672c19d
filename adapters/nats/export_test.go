package nats

import "github.com/nats-io/nats.go/jetstream"

// SetBeforeAck makes c call f right before it acks a committed message:
// the tests' way to crash a consumer between commit and ack.
func SetBeforeAck(c *Consumer, f func(jetstream.Msg)) { c.beforeAck = f }

// AsyncPending is how many of p's AsyncHandler publishes await their ack
// (-1 when its publisher does not say).
func AsyncPending(p *Publisher) int {
	if a, ok := p.async.(interface{ PublishAsyncPending() int }); ok {
		return a.PublishAsyncPending()
	}
	return -1
}
