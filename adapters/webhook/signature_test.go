package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/wire"
)

var rotatedKey = []byte("the-new-key-of-a-rotation")

// specVerify is a Standard Webhooks verifier written from the
// specification, independent of the package's: split webhook-signature on
// spaces, keep the v1 entries, compare each to the base64 HMAC-SHA256 of
// id.timestamp.body; the timestamp within five minutes.
func specVerify(key []byte, h http.Header, body []byte) bool {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "." + string(body)))
	want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	for _, sig := range strings.Split(h.Get("webhook-signature"), " ") {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

// TestStandardWebhooksVerifiersAcceptOurRequests: in every Format, the
// official Go verifier and one written from the specification accept the
// Sender's requests, under either key of a rotation, and refuse them under
// another key.
func TestStandardWebhooksVerifiersAcceptOurRequests(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			for _, format := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
				t.Run(format.String(), func(t *testing.T) {
					t.Parallel()
					rc := newReceiver(t, status(http.StatusNoContent))
					require.NoError(t, pathHandler(t, p, rc.URL, webhook.Config{Format: format})(t.Context(), ceEvent()))
					rotating := pathHandler(t, p, rc.URL, webhook.Config{Format: format, Secrets: [][]byte{rotatedKey}})
					require.NoError(t, rotating(t.Context(), ceEvent()))
					reqs := rc.requests()
					require.Len(t, reqs, 2)

					official := func(key []byte) *standardwebhooks.Webhook {
						wh, err := standardwebhooks.NewWebhookRaw(key)
						require.NoError(t, err)
						return wh
					}
					for i, r := range reqs {
						assert.Equal(t, ceEvent().ID, r.header.Get("webhook-id"), "the event ID")
						assert.Len(t, strings.Fields(r.header.Get("webhook-signature")), i+1, "one v1 entry per key")
						require.NoError(t, official(secret).Verify(r.body, r.header))
						assert.True(t, specVerify(secret, r.header, r.body))
						require.NoError(t, webhook.Verify(secret, r.header, r.body, 0))
						assert.Error(t, official([]byte("unknown")).Verify(r.body, r.header))
						assert.False(t, specVerify([]byte("unknown"), r.header, r.body))
					}
					rotated := reqs[1]
					require.NoError(t, official(rotatedKey).Verify(rotated.body, rotated.header), "a verifier with only the new key")
					assert.True(t, specVerify(rotatedKey, rotated.header, rotated.body))
					require.NoError(t, webhook.Verify(rotatedKey, rotated.header, rotated.body, 0))
					assert.Error(t, official(rotatedKey).Verify(reqs[0].body, reqs[0].header), "the first Sender has the old key only")

					// webhook-id is the event ID on every attempt; the timestamp is
					// the attempt's.
					assert.Equal(t, reqs[0].header.Get("webhook-id"), reqs[1].header.Get("webhook-id"))
				})
			}
		})
	}
}

// TestStandardWebhooksTestVector: the specification's published vector
// (the Go library's TestWebhookSign) is reproduced by SignStandardWebhooks
// and accepted by Verify; the secret string round-trips.
func TestStandardWebhooksTestVector(t *testing.T) {
	t.Parallel()
	const (
		secretString = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		msgID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		timestamp    = int64(1614265330)
		expected     = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	payload := []byte(`{"test": 2432232314}`)
	key, err := webhook.DecodeSecret(secretString)
	require.NoError(t, err)
	assert.Equal(t, secretString, webhook.EncodeSecret(key))
	unprefixed, err := webhook.DecodeSecret(strings.TrimPrefix(secretString, "whsec_"))
	require.NoError(t, err)
	assert.Equal(t, key, unprefixed)
	_, err = webhook.DecodeSecret("whsec_not base64!")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "not base64!", "the secret is not quoted")

	ts := strconv.FormatInt(timestamp, 10)
	assert.Equal(t, expected, webhook.SignStandardWebhooks(key, msgID, ts, payload))

	h := http.Header{}
	h.Set(webhook.HeaderWebhookID, msgID)
	h.Set(webhook.HeaderWebhookTimestamp, ts)
	h.Set(webhook.HeaderWebhookSignature, expected)
	age := time.Since(time.Unix(timestamp, 0)) + time.Hour
	require.NoError(t, webhook.Verify(key, h, payload, age))
	assert.ErrorIs(t, webhook.Verify(key, h, payload, 0), webhook.ErrStaleTimestamp, "2021 is over five minutes ago")
	h.Set(webhook.HeaderWebhookSignature, "v1a,deadbeef "+expected)
	require.NoError(t, webhook.Verify(key, h, payload, age), "unknown versions are skipped")
}

// signStandard returns the headers of a Standard Webhooks request signed at
// ts with each key.
func signStandard(id string, ts int64, body []byte, keys ...[]byte) http.Header {
	stamp := strconv.FormatInt(ts, 10)
	var sigs []string
	for _, k := range keys {
		sigs = append(sigs, webhook.SignStandardWebhooks(k, id, stamp, body))
	}
	h := http.Header{}
	h.Set(webhook.HeaderWebhookID, id)
	h.Set(webhook.HeaderWebhookTimestamp, stamp)
	h.Set(webhook.HeaderWebhookSignature, strings.Join(sigs, " "))
	return h
}

// TestVerifyStandardWebhooks: what Verify and VerifyAny refuse and accept
// in the Standard Webhooks scheme.
func TestVerifyStandardWebhooks(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt-1","payload":{"total":1}}`)
	now := time.Now().Unix()
	ok := signStandard("evt-1", now, body, secret)
	require.NoError(t, webhook.Verify(secret, ok, body, time.Minute))

	assert.ErrorIs(t, webhook.Verify(secret, ok, []byte(`{"id":"evt-1","payload":{"total":1000}}`), time.Minute), webhook.ErrInvalidSignature, "tampered body")
	assert.ErrorIs(t, webhook.Verify([]byte("unknown"), ok, body, time.Minute), webhook.ErrInvalidSignature, "unknown secret")

	wrongID := ok.Clone()
	wrongID.Set(webhook.HeaderWebhookID, "evt-2")
	assert.ErrorIs(t, webhook.Verify(secret, wrongID, body, time.Minute), webhook.ErrInvalidSignature, "webhook-id is signed")
	for _, empty := range []bool{false, true} {
		h := ok.Clone()
		if empty {
			h.Set(webhook.HeaderWebhookID, "")
		} else {
			h.Del(webhook.HeaderWebhookID)
		}
		err := webhook.Verify(secret, h, body, time.Minute)
		assert.ErrorIs(t, err, webhook.ErrInvalidSignature, "no webhook-id (empty: %v)", empty)
	}
	assert.ErrorIs(t, webhook.Verify(secret, signStandard("", now, body, secret), body, time.Minute), webhook.ErrInvalidSignature, "even signed over an empty ID")
	moved := signStandard("evt-1", now-3600, body, secret)
	moved.Set(webhook.HeaderWebhookTimestamp, strconv.FormatInt(now, 10))
	assert.ErrorIs(t, webhook.Verify(secret, moved, body, time.Minute), webhook.ErrInvalidSignature, "the timestamp is signed")
	assert.ErrorIs(t, webhook.Verify(secret, signStandard("evt-1", now-600, body, secret), body, 0), webhook.ErrStaleTimestamp, "stale: default 5 minutes")
	assert.ErrorIs(t, webhook.Verify(secret, signStandard("evt-1", now+600, body, secret), body, time.Minute), webhook.ErrStaleTimestamp, "from the future")
	require.NoError(t, webhook.Verify(secret, signStandard("evt-1", now-600, body, secret), body, time.Hour))
	noTS := ok.Clone()
	noTS.Del(webhook.HeaderWebhookTimestamp)
	assert.ErrorIs(t, webhook.Verify(secret, noTS, body, time.Minute), webhook.ErrStaleTimestamp)
	for _, sig := range []string{"", "v1,", "v1,!!!", "v2," + strings.TrimPrefix(ok.Get(webhook.HeaderWebhookSignature), "v1,"), "sha256=00"} {
		h := ok.Clone()
		h.Set(webhook.HeaderWebhookSignature, sig)
		assert.ErrorIs(t, webhook.Verify(secret, h, body, time.Minute), webhook.ErrInvalidSignature, sig)
	}

	// Rotation: a request signed with either active secret, or both.
	active := [][]byte{secret, rotatedKey}
	require.NoError(t, webhook.VerifyAny(active, signStandard("evt-1", now, body, secret), body, time.Minute))
	require.NoError(t, webhook.VerifyAny(active, signStandard("evt-1", now, body, rotatedKey), body, time.Minute))
	require.NoError(t, webhook.VerifyAny(active, signStandard("evt-1", now, body, []byte("unknown"), rotatedKey), body, time.Minute))
	assert.ErrorIs(t, webhook.VerifyAny(active, signStandard("evt-1", now, body, []byte("unknown")), body, time.Minute), webhook.ErrInvalidSignature)
	assert.ErrorIs(t, webhook.VerifyAny(active, signStandard("evt-1", now-600, body, rotatedKey), body, time.Minute), webhook.ErrStaleTimestamp)
	assert.Error(t, webhook.VerifyAny(nil, ok, body, time.Minute))
	assert.Error(t, webhook.VerifyAny([][]byte{secret, nil}, ok, body, time.Minute))

	// The 0.1 scheme is still accepted by both.
	legacy := signedRequest(t, "http://x", rotatedKey, now, string(body)).Header
	require.NoError(t, webhook.Verify(rotatedKey, legacy, body, time.Minute))
	require.NoError(t, webhook.VerifyAny(active, legacy, body, time.Minute))
	assert.ErrorIs(t, webhook.Verify(secret, legacy, body, time.Minute), webhook.ErrInvalidSignature)
	assert.ErrorIs(t, webhook.Verify(secret, http.Header{}, body, time.Minute), webhook.ErrStaleTimestamp, "no signature headers at all")
}

// TestConsumerVerifiesStandardWebhooks: the receiver refuses (401) what
// Verify refuses and accepts requests signed with either of its secrets,
// and 0.1-scheme requests, from real Senders.
func TestConsumerVerifiesStandardWebhooks(t *testing.T) {
	t.Parallel()
	cs := newConsumerSide(t, webhook.ConsumerConfig{Secrets: [][]byte{rotatedKey}}, nil)
	env := func(id string) []byte {
		return fmt.Appendf(nil, `{"id":%q,"type":"t","occurred_at":"2025-03-04T05:06:07Z","payload":{"n":1}}`, id)
	}
	post := func(h http.Header, body []byte) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, cs.srv.URL, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header = h
		req.Header.Set("Content-Type", "application/json")
		return do(t, req).StatusCode
	}
	now := time.Now().Unix()
	assert.Equal(t, http.StatusUnauthorized, post(signStandard("a", now, env("a"), secret), env("b")), "tampered body")
	assert.Equal(t, http.StatusUnauthorized, post(signStandard("a", now-600, env("a"), secret), env("a")), "stale")
	wrongID := signStandard("a", now, env("a"), secret)
	wrongID.Set(webhook.HeaderWebhookID, "b")
	assert.Equal(t, http.StatusUnauthorized, post(wrongID, env("a")), "wrong webhook-id")
	assert.Equal(t, http.StatusUnauthorized, post(signStandard("a", now, env("a"), []byte("unknown")), env("a")), "unknown secret")
	assert.Equal(t, http.StatusBadRequest, post(signStandard("x", now, env("a"), secret), env("a")), "signed, but the event ID is not the webhook-id")
	assert.Zero(t, cs.calls.Load())

	assert.Equal(t, http.StatusNoContent, post(signStandard("a", now, env("a"), secret), env("a")))
	assert.Equal(t, http.StatusNoContent, post(signStandard("b", now, env("b"), rotatedKey), env("b")), "the other active secret")

	for name, cfg := range map[string]webhook.Config{
		"default":        {},
		"rotating":       {Secrets: [][]byte{rotatedKey}},
		"0.1 scheme":     {Signature: webhook.XOutboxSignature},
		"cloudevents":    {Format: wire.CloudEvents},
		"structured 0.1": {Format: wire.CloudEventsJSON, Signature: webhook.XOutboxSignature},
	} {
		e := ceEvent()
		e.ID = name
		require.NoError(t, newHandler(t, cs.srv.URL, cfg)(t.Context(), e), name)
		s, err := webhook.New(cs.srv.URL, rotatedKey, cfg)
		require.NoError(t, err)
		e.ID = name + " (rotated key)"
		require.NoError(t, s.Handler()(t.Context(), e), name)
	}
	assert.EqualValues(t, 12, cs.calls.Load())
}

// TestXOutboxSignatureScheme: the 0.1 scheme on request, as 0.1 sent it;
// what New refuses.
func TestXOutboxSignatureScheme(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, status(http.StatusNoContent))
			require.NoError(t, pathHandler(t, p, rc.URL, webhook.Config{
				Signature: webhook.XOutboxSignature,
				Header:    http.Header{"Webhook-Signature": {"v1,forged"}, "X-Outbox-Signature": {"sha256=00"}},
			})(t.Context(), sampleEvent()))
			r := rc.requests()[0]
			ts := r.header.Get(webhook.HeaderTimestamp)
			assert.Equal(t, webhook.Sign(secret, ts, r.body), r.header.Get(webhook.HeaderSignature))
			for _, k := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
				assert.Empty(t, r.header.Values(k), "%s: no Standard Webhooks header, Config.Header's neither", k)
			}
			require.NoError(t, webhook.Verify(secret, r.header, r.body, time.Minute))

			// Config.Header cannot set a signature header in the default scheme
			// either.
			require.NoError(t, pathHandler(t, p, rc.URL, webhook.Config{
				Header: http.Header{"X-Outbox-Timestamp": {"1"}, "Webhook-Id": {"spoofed"}},
			})(t.Context(), sampleEvent()))
			r = rc.requests()[1]
			assert.Empty(t, r.header.Values(webhook.HeaderTimestamp))
			assert.Equal(t, []string{"evt-1"}, r.header.Values(webhook.HeaderWebhookID))

			for name, cfg := range map[string]webhook.Config{
				"rotation without room":  {Signature: webhook.XOutboxSignature, Secrets: [][]byte{rotatedKey}},
				"unknown scheme":         {Signature: webhook.Scheme(7)},
				"empty additional key":   {Secrets: [][]byte{rotatedKey, {}}},
				"payload only in CE":     {Format: wire.CloudEventsJSON, PayloadOnly: true},
				"unknown wire format -1": {Format: wire.Format(-1)},
			} {
				_, err := webhook.New("https://example.com/h", secret, cfg)
				assert.Error(t, err, name)
			}
			assert.Equal(t, "standard-webhooks", webhook.StandardWebhooks.String())
			assert.Equal(t, "x-outbox-signature", webhook.XOutboxSignature.String())
		})
	}
}
