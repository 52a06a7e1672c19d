package nats

import "github.com/nats-io/nats.go/jetstream"

// SetBeforeAck makes c call f right before it acks a committed message:
// the tests' way to crash a consumer between commit and ack.
func SetBeforeAck(c *Consumer, f func(jetstream.Msg)) { c.beforeAck = f }
