package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"

	"github.com/gorm-outbox/outbox"
)

// TestErrorClassification checks, without a broker, which errors say the
// broker is down (the relay pauses and counts no attempt) and which are
// about the message (retried with backoff, counted).
func TestErrorClassification(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for name, tc := range map[string]struct {
		err         error
		unavailable bool
	}{
		"connection closed by a restart": {closeReason("connection", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", Server: true}, true), true},
		"connection dropped":             {closeReason("connection", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp: connection reset by peer"}, true), true},
		"connection closed, no reason":   {closeReason("connection", nil, false), true},
		"channel closed, no reason":      {closeReason("channel", nil, false), true},
		"channel closed, hard error":     {closeReason("channel", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED", Server: true}, true), true},
		"exchange missing":               {closeReason("channel", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'", Server: true, Recover: true}, true), true},
		"exchange forbidden":             {closeReason("channel", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED", Server: true, Recover: true}, true), true},
		"message over max size":          {closeReason("channel", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200000000 is larger than configured max size 134217728", Server: true, Recover: true}, true), false},
		"content too large":              {closeReason("channel", &amqp.Error{Code: amqp.ContentTooLarge, Reason: "CONTENT_TOO_LARGE", Server: true, Recover: true}, true), false},
		"closed for one of several":      {sharedBy(closeReason("channel", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED", Server: true, Recover: true}, true), 3), true},
		"closed for the only one":        {sharedBy(closeReason("channel", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED", Server: true, Recover: true}, true), 1), false},
		"connection closed, several":     {sharedBy(closeReason("connection", nil, false), 3), true},
		"session replaced":               {ErrConnectionLost, true},
		"blocked (resource alarm)":       {fmt.Errorf("%w: low on memory", ErrBlocked), true},
		"publisher closed":               {ErrClosed, true},
		"channel closed before publish":  {amqp.ErrClosed, true},
		"confirm timed out":              {context.DeadlineExceeded, true},
		"dial refused":                   {refused, true},
		"nacked":                         {ErrNacked, false},
		"returned (no route)":            {fmt.Errorf("%w: 312 NO_ROUTE", ErrUnroutable), false},
		"cancelled by the caller":        {context.Canceled, false},
	} {
		err := classify((&Publisher{exchange: "x"}).publishError(tc.err, "k"))
		assert.ErrorIs(t, err, tc.err, name)
		assert.Equal(t, tc.unavailable, outbox.IsUnavailable(err), "%s: %v", name, err)
		assert.False(t, outbox.IsPermanent(err), name)
	}
	// The close reason keeps its text and its wrapped errors.
	err := closeReason("channel", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange", Recover: true}, true)
	assert.EqualError(t, err, "channel closed before the broker confirmed the message: Exception (404) Reason: \"NOT_FOUND - no exchange\"")
	assert.EqualError(t, closeReason("connection", nil, false), "connection closed before the broker confirmed the message")
	var amqpErr *amqp.Error
	assert.True(t, errors.As(err, &amqpErr))
	assert.ErrorIs(t, err, ErrConnectionLost)

	// A close for one of several messages says so; one that is not about
	// a message is told to each of them as it is.
	shared := sharedBy(closeReason("channel", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - invalid expiration", Recover: true}, true), 5)
	assert.EqualError(t, shared, "channel closed before the broker confirmed the message (closed for this message or one of the 4 others awaiting a confirm on it): Exception (406) Reason: \"PRECONDITION_FAILED - invalid expiration\"")
	assert.EqualError(t, sharedBy(err, 5), err.Error())

	// A publish's error: the cause first, then the destination and the
	// adapter, then the core's mark.
	assert.EqualError(t, classify((&Publisher{exchange: "outbox.events"}).publishError(err, "order.created")),
		`channel closed before the broker confirmed the message: Exception (404) Reason: "NOT_FOUND - no exchange": exchange "outbox.events", routing key "order.created" (outbox/rabbitmq) (destination unavailable)`)
}
