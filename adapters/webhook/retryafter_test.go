package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"120":                           2 * time.Minute,
		"-5":                            0,
		"999999":                        maxRetryAfter,
		"Thu, 01 Jan 2026 00:00:30 GMT": 30 * time.Second,
	} {
		d, ok := retryAfter(v, now)
		require.True(t, ok, v)
		assert.Equal(t, want, d, v)
	}
	for _, v := range []string{"", "soon"} {
		_, ok := retryAfter(v, now)
		assert.False(t, ok, v)
	}
}

// deliveries are the Sender's two handlers, as Handlers: Handler, and
// AsyncHandler's start followed at once by its wait.
var deliveries = map[string]func(*Sender) outbox.Handler{
	"Handler": (*Sender).Handler,
	"AsyncHandler": func(s *Sender) outbox.Handler {
		h := s.AsyncHandler()
		return func(ctx context.Context, e outbox.Event) error { return h(ctx, e)() }
	},
}

func TestRetryAfterHeaderReachesTheRelay(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "90")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	s, err := New(srv.URL, []byte("k"), Config{})
	require.NoError(t, err)
	for name, handler := range deliveries {
		err = handler(s)(context.Background(), outbox.Event{ID: "e1", Type: "t", Payload: []byte(`{}`)})
		require.Error(t, err, name)
		assert.False(t, outbox.IsPermanent(err), name)
		var se *StatusError
		require.True(t, errors.As(err, &se), name)
		assert.Equal(t, http.StatusTooManyRequests, se.StatusCode, name)
		assert.Contains(t, err.Error(), "retry after 1m30s", name)
		assert.False(t, outbox.IsUnavailable(err), name)
	}
}

// TestRetryAfterWinsOverUnavailable: a 503 with Retry-After is honoured
// (outbox.RetryAfter, counted); without it the endpoint is reported down.
func TestRetryAfterWinsOverUnavailable(t *testing.T) {
	for header, unavailable := range map[string]bool{"30": false, "": true} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if header != "" {
				w.Header().Set("Retry-After", header)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		s, err := New(srv.URL, []byte("k"), Config{})
		require.NoError(t, err)
		for name, handler := range deliveries {
			err = handler(s)(context.Background(), outbox.Event{ID: "e1", Type: "t", Payload: []byte(`{}`)})
			require.Error(t, err)
			assert.Equal(t, unavailable, outbox.IsUnavailable(err), "%s, Retry-After %q: %v", name, header, err)
			assert.Equal(t, !unavailable, strings.Contains(err.Error(), "retry after 30s"), "%s, Retry-After %q: %v", name, header, err)
		}
		srv.Close()
	}
}
