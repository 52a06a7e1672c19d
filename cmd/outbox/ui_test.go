package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a writer the test reads while the command writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

var servingRE = regexp.MustCompile(`dashboard on (http://\S+/)`)

// TestUI serves the dashboard, read-only by default, and stops on the
// context's end (Ctrl-C) with status 0.
func TestUI(t *testing.T) {
	forEach(t, func(t *testing.T, f *fixture) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var stderr lockedBuffer
		done := make(chan int, 1)
		env := map[string]string{"OUTBOX_DSN": f.dsn, "OUTBOX_TABLE": f.table}
		go func() {
			done <- run(ctx, []string{"ui", "--listen", "127.0.0.1:0", "--max-pending-age", "1ns"}, strings.NewReader(""), io.Discard, &stderr, func(k string) string { return env[k] })
		}()
		var base string
		require.Eventually(t, func() bool {
			m := servingRE.FindStringSubmatch(stderr.String())
			if m != nil {
				base = m[1]
			}
			return m != nil
		}, 30*time.Second, 10*time.Millisecond, "the serving line: %s", stderr.String())

		resp, err := http.Get(base + "events?status=failed")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, string(body), "bad-1")
		assert.NotContains(t, string(body), "ok-1", "filtered to failed")
		assert.NotContains(t, string(body), "4242", "payloads hidden by default")
		assert.Contains(t, string(body), `id="warning-behind"`, "--max-pending-age sets the warning's threshold: wait-1 is older than 1ns")

		// The hint under a hidden payload names this command's flag.
		resp, err = http.Get(base + "event?id=bad-1")
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Contains(t, string(body), "hidden (restart outbox ui with --show-payloads to show payloads)")
		assert.NotContains(t, string(body), "outboxui.Options")

		cancel()
		select {
		case code := <-done:
			assert.Equal(t, exitOK, code, stderr.String())
		case <-time.After(10 * time.Second):
			t.Fatal("outbox ui did not stop when its context ended")
		}
	})
}
