package webhook_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox/adapters/webhook"
)

// A signature tampered with, for TestTamperedSignaturesAreRefused: its MAC
// bytes changed, its encoding (base64, hex) still valid, so that only the
// comparison of the whole MAC, length included, can refuse it.
var signatureTampers = []struct {
	name string
	mac  func(mac []byte) []byte
}{
	{"last byte altered", func(m []byte) []byte { m = bytes.Clone(m); m[len(m)-1] ^= 0x01; return m }},
	{"first byte altered", func(m []byte) []byte { m = bytes.Clone(m); m[0] ^= 0x80; return m }},
	{"truncated by one byte", func(m []byte) []byte { return bytes.Clone(m[:len(m)-1]) }},
	{"truncated to 16 bytes", func(m []byte) []byte { return bytes.Clone(m[:16]) }},
	{"one byte appended", func(m []byte) []byte { return append(bytes.Clone(m), 0) }},
	{"the MAC appended to itself", func(m []byte) []byte { return append(bytes.Clone(m), m...) }},
}

// A signature scheme Verify accepts: how a request is signed, and how the
// MAC of each signature in its headers is rewritten.
type tamperScheme struct {
	name string
	sign func(id string, ts int64, body []byte) http.Header
	// rewrite applies f to the MAC of every signature in h.
	rewrite func(t *testing.T, h http.Header, f func([]byte) []byte)
}

var tamperSchemes = []tamperScheme{
	{
		name: "standard-webhooks",
		sign: func(id string, ts int64, body []byte) http.Header {
			return signStandard(id, ts, body, secret)
		},
		rewrite: rewriteStandard,
	},
	{
		// A Sender rotating its key: one v1 entry per key, each of them
		// tampered with.
		name: "standard-webhooks, two keys",
		sign: func(id string, ts int64, body []byte) http.Header {
			return signStandard(id, ts, body, rotatedKey, secret)
		},
		rewrite: rewriteStandard,
	},
	{
		name: "x-outbox-signature",
		sign: func(_ string, ts int64, body []byte) http.Header {
			stamp := strconv.FormatInt(ts, 10)
			h := http.Header{}
			h.Set(webhook.HeaderTimestamp, stamp)
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, stamp, body))
			return h
		},
		rewrite: func(t *testing.T, h http.Header, f func([]byte) []byte) {
			hexMAC, ok := strings.CutPrefix(h.Get(webhook.HeaderSignature), "sha256=")
			require.True(t, ok)
			mac, err := hex.DecodeString(hexMAC)
			require.NoError(t, err)
			require.Len(t, mac, 32)
			h.Set(webhook.HeaderSignature, "sha256="+hex.EncodeToString(f(mac)))
		},
	},
}

// rewriteStandard applies f to the MAC of every v1 entry of h's
// webhook-signature.
func rewriteStandard(t *testing.T, h http.Header, f func([]byte) []byte) {
	entries := strings.Fields(h.Get(webhook.HeaderWebhookSignature))
	require.NotEmpty(t, entries)
	for i, entry := range entries {
		b64, ok := strings.CutPrefix(entry, "v1,")
		require.True(t, ok, entry)
		mac, err := base64.StdEncoding.DecodeString(b64)
		require.NoError(t, err)
		require.Len(t, mac, 32)
		entries[i] = "v1," + base64.StdEncoding.EncodeToString(f(mac))
	}
	h.Set(webhook.HeaderWebhookSignature, strings.Join(entries, " "))
}

// TestTamperedSignaturesAreRefused: a signature whose MAC differs from the
// right one in its last byte, or its first, or is a prefix of it, or has
// bytes appended, is refused in every scheme and through every verifying
// path: Verify, VerifyAny (with the signing key among others) and the
// Consumer (401, Handle not run); the untampered request is accepted by
// each. A comparison of part of the MAC (its first 16 bytes, say) fails
// this test.
func TestTamperedSignaturesAreRefused(t *testing.T) {
	t.Parallel()
	cs := newConsumerSide(t, webhook.ConsumerConfig{Secrets: [][]byte{rotatedKey}}, nil)
	paths := []struct {
		name string
		// verify returns nil when the request is accepted, else an error
		// wrapping webhook.ErrInvalidSignature when refused for its
		// signature.
		verify func(t *testing.T, h http.Header, body []byte) error
	}{
		{"Verify", func(_ *testing.T, h http.Header, body []byte) error {
			return webhook.Verify(secret, h, body, time.Minute)
		}},
		{"VerifyAny", func(_ *testing.T, h http.Header, body []byte) error {
			return webhook.VerifyAny([][]byte{[]byte("another-active-key"), secret, rotatedKey}, h, body, time.Minute)
		}},
		{"Consumer", func(t *testing.T, h http.Header, body []byte) error {
			calls := cs.calls.Load()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, cs.srv.URL, bytes.NewReader(body))
			require.NoError(t, err)
			req.Header = h.Clone()
			req.Header.Set("Content-Type", "application/json")
			switch code := do(t, req).StatusCode; code {
			case http.StatusNoContent:
				assert.Equal(t, calls+1, cs.calls.Load(), "Handle ran once")
				return nil
			case http.StatusUnauthorized:
				assert.Equal(t, calls, cs.calls.Load(), "Handle did not run")
				return webhook.ErrInvalidSignature
			default:
				return fmt.Errorf("status %d", code)
			}
		}},
	}
	n := 0
	for _, scheme := range tamperSchemes {
		for _, path := range paths {
			t.Run(scheme.name+"/"+path.name+"/untampered", func(t *testing.T) {
				n++
				id := fmt.Sprintf("evt-%d", n)
				body := tamperBody(id)
				require.NoError(t, path.verify(t, scheme.sign(id, time.Now().Unix(), body), body))
			})
			for _, tamper := range signatureTampers {
				t.Run(scheme.name+"/"+path.name+"/"+tamper.name, func(t *testing.T) {
					n++
					id := fmt.Sprintf("evt-%d", n)
					body := tamperBody(id)
					h := scheme.sign(id, time.Now().Unix(), body)
					signed := h.Clone()
					scheme.rewrite(t, h, tamper.mac)
					require.NotEqual(t, signed, h, "the signature changed")
					assert.ErrorIs(t, path.verify(t, h, body), webhook.ErrInvalidSignature)
				})
			}
		}
	}
}

// tamperBody is the envelope of an event with the ID id, as a Sender posts
// it: a Consumer accepts it when its signature is right.
func tamperBody(id string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"t","occurred_at":"2025-03-04T05:06:07Z","payload":{"n":1}}`, id)
}
