package kafka

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
)

// TestErrorClassification checks, without a broker, which produce errors
// say the brokers are down (the relay pauses and counts no attempt) and
// which are about the record (retried with backoff, counted, or
// permanent).
func TestErrorClassification(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		err         error
		unavailable bool
	}{
		"no ack before the deadline": {context.DeadlineExceeded, true},
		"record timeout":             {kgo.ErrRecordTimeout, true},
		"record retries":             {kgo.ErrRecordRetries, true},
		"client closed":              {kgo.ErrClientClosed, true},
		"buffer full":                {kgo.ErrMaxBuffered, true},
		"connection refused":         {&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		"DNS failure":                {&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "kafka.invalid", IsNotFound: true}}, true},
		"broker not available":       {kerr.BrokerNotAvailable, true},
		"leader not available":       {kerr.LeaderNotAvailable, true},
		"not leader":                 {kerr.NotLeaderForPartition, true},
		"not enough replicas":        {kerr.NotEnoughReplicas, true},
		"request timed out":          {kerr.RequestTimedOut, true},
		"network exception":          {kerr.NetworkException, true},
		"unknown topic":              {kerr.UnknownTopicOrPartition, true},
		"SASL failed":                {kerr.SaslAuthenticationFailed, true},
		"topic not authorized":       {kerr.TopicAuthorizationFailed, false},
		"corrupt message":            {kerr.CorruptMessage, false},
		"message too large":          {kerr.MessageTooLarge, false}, // Publish makes it Permanent first
		"cancelled by the caller":    {context.Canceled, false},
	} {
		err := publishError(tc.err, "t")
		assert.Equal(t, tc.unavailable, unavailable(err), name)
	}
}

// TestClassify: what Publish and the AsyncHandler's wait return for a
// produce's result, on one path.
func TestClassify(t *testing.T) {
	t.Parallel()
	assert.NoError(t, classify(nil, "t"))
	for name, tc := range map[string]struct {
		err                    error
		permanent, unavailable bool
	}{
		"message too large":  {kerr.MessageTooLarge, true, false},
		"invalid record":     {kerr.InvalidRecord, true, false},
		"invalid topic":      {kerr.InvalidTopicException, true, false},
		"client closed":      {kgo.ErrClientClosed, false, true},
		"buffer full":        {kgo.ErrMaxBuffered, false, true},
		"no leader":          {kerr.NotLeaderForPartition, false, true},
		"topic unauthorized": {kerr.TopicAuthorizationFailed, false, false},
	} {
		err := classify(tc.err, "orders")
		assert.ErrorIs(t, err, tc.err, name)
		assert.Equal(t, tc.permanent, outbox.IsPermanent(err), name)
		assert.Equal(t, tc.unavailable, outbox.IsUnavailable(err), name)
		assert.Contains(t, err.Error(), ": topic orders (outbox/kafka)", name)
	}
}

// TestOutcome: the wait returns the produce's result, or "no ack" once ctx
// ends; a result that is there when ctx has ended wins.
func TestOutcome(t *testing.T) {
	t.Parallel()
	done := make(chan error, 1)
	done <- kerr.InvalidRecord
	assert.True(t, outbox.IsPermanent(outcome(t.Context(), done, "t")))

	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	err := outcome(ctx, make(chan error, 1), "t")
	assert.True(t, outbox.IsUnavailable(err))
	assert.Equal(t, "no ack from the broker: context deadline exceeded: topic t (outbox/kafka) (destination unavailable)", err.Error())

	for range 100 { // the select would pick either at random
		done := make(chan error, 1)
		done <- nil
		assert.NoError(t, outcome(ctx, done, "t"), "the ack wins over the deadline")
	}
}
