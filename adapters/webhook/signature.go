package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Scheme is how a [Sender] signs its requests ([Config.Signature]).
// [Verify] accepts both, telling them apart by the headers present.
type Scheme int

const (
	// StandardWebhooks signs as the Standard Webhooks specification
	// (standardwebhooks.com) asks, so that any of its verifiers, in any
	// language, checks the Sender's requests: the headers
	//
	//	webhook-id: <event ID, the same on every retry>
	//	webhook-timestamp: <Unix seconds of this attempt>
	//	webhook-signature: v1,<base64 HMAC-SHA256(key, id + "." + timestamp + "." + body)>
	//
	// with one space-separated v1 entry per key while keys are rotated
	// ([Config.Secrets]). The default.
	StandardWebhooks Scheme = iota
	// XOutboxSignature is the scheme of release 0.1, for receivers that
	// check it: X-Outbox-Timestamp ([HeaderTimestamp]) and
	// X-Outbox-Signature ([HeaderSignature], see [Sign]). It signs the
	// timestamp and the body, not the event ID, and with one key only.
	XOutboxSignature
)

// String returns "standard-webhooks" or "x-outbox-signature".
func (s Scheme) String() string {
	switch s {
	case StandardWebhooks:
		return "standard-webhooks"
	case XOutboxSignature:
		return "x-outbox-signature"
	}
	return "Scheme(" + strconv.Itoa(int(s)) + ")"
}

// The headers of the [StandardWebhooks] scheme, as the specification
// spells them (net/http sends them as Webhook-Id, ...; header names are
// case-insensitive).
const (
	// HeaderWebhookID carries the event ID: receivers deduplicate by it,
	// and it is under the signature.
	HeaderWebhookID = "webhook-id"
	// HeaderWebhookTimestamp carries the time of this attempt in decimal
	// Unix seconds; it is under the signature.
	HeaderWebhookTimestamp = "webhook-timestamp"
	// HeaderWebhookSignature carries one "v1," + base64 signature per key,
	// separated by spaces (see [SignStandardWebhooks]).
	HeaderWebhookSignature = "webhook-signature"
)

// The headers of the [XOutboxSignature] scheme (release 0.1's).
const (
	// HeaderTimestamp carries the time of this attempt in decimal Unix
	// seconds; it is part of the signed string.
	HeaderTimestamp = "X-Outbox-Timestamp"
	// HeaderSignature carries "sha256=" and the hex HMAC-SHA256 of
	// timestamp + "." + body (see [Sign]).
	HeaderSignature = "X-Outbox-Signature"
)

// signaturePrefix names the 0.1 scheme's algorithm.
const signaturePrefix = "sha256="

// secretPrefix is how Standard Webhooks writes a key as text.
const secretPrefix = "whsec_"

// EncodeSecret returns key as Standard Webhooks receivers and their
// libraries expect it in their configuration: "whsec_" followed by the
// standard base64 of the key. [New] and [NewConsumer] take the raw key
// bytes, which is what [DecodeSecret] returns for such a string.
func EncodeSecret(key []byte) string {
	return secretPrefix + base64.StdEncoding.EncodeToString(key)
}

// DecodeSecret returns the raw key of a Standard Webhooks secret string,
// "whsec_" and base64 (the prefix may be left out), as [New] and
// [NewConsumer] take it.
func DecodeSecret(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, secretPrefix))
	if err != nil || len(key) == 0 {
		// Never quote the secret.
		return nil, errors.New("outbox/webhook: DecodeSecret: not \"whsec_\" followed by standard base64")
	}
	return key, nil
}

// SignStandardWebhooks returns one webhook-signature entry of the
// [StandardWebhooks] scheme for body sent with the webhook-id id and the
// webhook-timestamp timestamp (decimal Unix seconds): "v1," and the
// standard base64 of HMAC-SHA256 under key of id + "." + timestamp + "." +
// body. A Sender with several keys sends one entry per key, separated by
// spaces.
func SignStandardWebhooks(key []byte, id, timestamp string, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(macStandard(key, id, timestamp, body))
}

func macStandard(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Sign returns the X-Outbox-Signature value of the [XOutboxSignature]
// scheme (release 0.1's) for body sent with the X-Outbox-Timestamp value
// timestamp (decimal Unix seconds): "sha256=" and the hex HMAC-SHA256 of
// timestamp + "." + body under secret. Receivers in other languages compute
// the same to check a request. The default scheme's is
// [SignStandardWebhooks].
func Sign(secret []byte, timestamp string, body []byte) string {
	return sign(secret, timestamp, body)
}

func sign(secret []byte, ts string, body []byte) string {
	return signaturePrefix + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Errors of [Verify].
var (
	// ErrInvalidSignature: the signature is missing, malformed, or does not
	// match the body (and the webhook-id and timestamp) under any secret;
	// or a Standard Webhooks request has no webhook-id.
	ErrInvalidSignature = errors.New("outbox/webhook: invalid signature")
	// ErrStaleTimestamp: the timestamp is missing, malformed, or further
	// from the receiver's clock than the max age (a replay, or clocks that
	// disagree).
	ErrStaleTimestamp = errors.New("outbox/webhook: timestamp missing or outside the allowed age")
)

// Verify checks a request a [Sender] made, in either [Scheme]: header is
// the request's header and body its raw body, read in full before
// decoding. A request with any of the webhook-* headers is checked as
// [StandardWebhooks] (webhook-id must be set), one without as
// [XOutboxSignature]. It returns nil when the signature matches the body
// (and, for Standard Webhooks, the webhook-id and webhook-timestamp; for
// the 0.1 scheme, X-Outbox-Timestamp) under secret, compared in constant
// time, and that timestamp is within maxAge of the receiver's clock
// (either way, to allow for skew); otherwise an error wrapping
// [ErrInvalidSignature] or [ErrStaleTimestamp]. maxAge 0 means
// [DefaultMaxAge]. [VerifyAny] accepts several secrets, for a rotation.
//
// Verify does not remember requests: to reject a replay inside maxAge,
// deduplicate by the webhook-id header (Standard Webhooks: the event ID,
// under the signature) or the envelope's "id", which receivers need for
// at-least-once delivery anyway.
func Verify(secret []byte, header http.Header, body []byte, maxAge time.Duration) error {
	return verify([][]byte{secret}, header, body, maxAge, time.Now())
}

// VerifyAny is [Verify] with several active secrets: nil when the request
// is signed with any one of them. While a secret is rotated, the receiver
// accepts the old and the new one; a Standard Webhooks Sender given both
// ([Config.Secrets]) signs with both.
func VerifyAny(secrets [][]byte, header http.Header, body []byte, maxAge time.Duration) error {
	return verify(secrets, header, body, maxAge, time.Now())
}

// standardRequest reports whether a request carries the headers of the
// Standard Webhooks scheme.
func standardRequest(header http.Header) bool {
	for _, k := range [...]string{HeaderWebhookID, HeaderWebhookTimestamp, HeaderWebhookSignature} {
		if len(header.Values(k)) > 0 {
			return true
		}
	}
	return false
}

// verify is every verification: Verify's, VerifyAny's and the
// Consumer's.
func verify(secrets [][]byte, header http.Header, body []byte, maxAge time.Duration, now time.Time) error {
	if len(secrets) == 0 {
		return fmt.Errorf("%w: no secret", ErrInvalidSignature)
	}
	for _, s := range secrets {
		if len(s) == 0 {
			return fmt.Errorf("%w: empty secret", ErrInvalidSignature)
		}
	}
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	var tsHeader string
	var ok bool
	if standardRequest(header) {
		tsHeader = HeaderWebhookTimestamp
		ok = verifyStandard(secrets, header, body)
		if header.Get(HeaderWebhookID) == "" {
			return fmt.Errorf("%w: %s is missing or empty", ErrInvalidSignature, HeaderWebhookID)
		}
	} else {
		tsHeader = HeaderTimestamp
		ok = verifyXOutbox(secrets, header, body)
	}
	ts := header.Get(tsHeader)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is missing or not Unix seconds", ErrStaleTimestamp, tsHeader)
	}
	// The signature is checked before the age: a forged request is
	// reported as forged.
	if !ok {
		return ErrInvalidSignature
	}
	age := now.Sub(time.Unix(sec, 0))
	if age > maxAge || age < -maxAge {
		return fmt.Errorf("%w: timestamp is %v from now, over %v", ErrStaleTimestamp, age.Round(time.Second), maxAge)
	}
	return nil
}

// verifyStandard reports whether one of the request's v1 signatures
// matches under one of the secrets.
func verifyStandard(secrets [][]byte, header http.Header, body []byte) bool {
	id, ts := header.Get(HeaderWebhookID), header.Get(HeaderWebhookTimestamp)
	want := make([][]byte, len(secrets))
	for i, s := range secrets {
		want[i] = macStandard(s, id, ts, body)
	}
	ok := false
	for _, v := range header.Values(HeaderWebhookSignature) {
		for _, entry := range strings.Fields(v) {
			b64, isV1 := strings.CutPrefix(entry, "v1,")
			if !isV1 {
				continue // another version, which the spec lets a receiver skip
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				continue
			}
			for _, w := range want {
				// Every comparison is made, so the time taken does not
				// say which entry or secret matched.
				if hmac.Equal(got, w) {
					ok = true
				}
			}
		}
	}
	return ok
}

// verifyXOutbox reports whether the 0.1 scheme's signature matches under
// one of the secrets.
func verifyXOutbox(secrets [][]byte, header http.Header, body []byte) bool {
	sig, isSHA := strings.CutPrefix(header.Get(HeaderSignature), signaturePrefix)
	if !isSHA {
		return false
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	ts := header.Get(HeaderTimestamp)
	ok := false
	for _, s := range secrets {
		if hmac.Equal(got, mac(s, ts, body)) {
			ok = true
		}
	}
	return ok
}
