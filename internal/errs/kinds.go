package errs

import (
	"errors"
	"fmt"
	"time"
)

// The kinds of handler failure the relay tells apart; the root package's
// Permanent, RetryAfter and Unavailable make them, and document them.

// Permanent marks err as not worth retrying.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err's chain holds a Permanent mark.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// RetryAfter asks for a retry no sooner than d from now.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, d: max(d, 0)}
}

// RetryDelay returns the delay a RetryAfter in err's chain asks for.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.d, true
	}
	return 0, false
}

// Unavailable marks err as the destination being down, not the event bad.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

// IsUnavailable reports whether err's chain holds an Unavailable mark.
func IsUnavailable(err error) bool {
	var u *unavailableError
	return errors.As(err, &u)
}

type retryAfterError struct {
	err error
	d   time.Duration
}

func (e *retryAfterError) Error() string { return fmt.Sprintf("%v (retry after %v)", e.err, e.d) }
func (e *retryAfterError) Unwrap() error { return e.err }

type unavailableError struct{ err error }

// The kinds follow the cause, not precede it: an error is read (in a
// last_error column cut to a width, in a log line) from its start, where
// the cause is.
func (e *unavailableError) Error() string { return fmt.Sprintf("%v (destination unavailable)", e.err) }
func (e *unavailableError) Unwrap() error { return e.err }

type permanentError struct{ err error }

func (e *permanentError) Error() string { return fmt.Sprintf("%v (permanent)", e.err) }
func (e *permanentError) Unwrap() error { return e.err }
