package kafka

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
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
