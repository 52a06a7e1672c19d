package encode

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The root hands its ErrInvalidEvent in; every refusal, whichever check
// makes it, must wrap exactly that value, and a batch's error must say
// which event it is about.
func TestErrorsWrapTheGivenSentinel(t *testing.T) {
	sentinel := errors.New("outbox: invalid event")
	c := &Encoder{Invalid: sentinel, MaxPayload: 16}
	for name, ev := range map[string]Event{
		"no type":     {},
		"long id":     {Type: "x", ID: strings.Repeat("i", maxFieldLen+1)},
		"year":        {Type: "x", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"payload":     {Type: "x", Payload: []byte("{")},
		"big payload": {Type: "x", Payload: strings.Repeat("p", 16)},
		"header name": {Type: "x", Headers: map[string]string{"": "v"}},
		"header":      {Type: "x", Headers: map[string]string{"k": "\x00"}},
		"jsonb":       {Type: "x", Payload: []byte(`"\u0000"`)},
	} {
		_, err := All(c, []Event{{Type: "ok"}, ev}, nil, time.Now())
		if !errors.Is(err, sentinel) {
			t.Errorf("%s: %v does not wrap the sentinel", name, err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "event 2 of 2: outbox: invalid event: ") {
			t.Errorf("%s: %q does not name the event", name, err)
		}
	}
}

// A type with Event's fields, as the root's outbox.Event, is encoded as
// it is, and generated says which events had their ID and key left to
// the outbox.
func TestAllTakesLikeTypes(t *testing.T) {
	type mine Fields
	now := time.Date(2024, 1, 2, 3, 4, 5, 6789, time.FixedZone("x", 3600))
	out, err := All(&Encoder{MaxPayload: DefaultMaxPayload}, []mine{
		{Type: "a", Payload: map[string]int{"n": 1}, Headers: map[string]string{"h": "v"}},
		{Type: "b", ID: "id"},
	}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if a := out[0]; !a.Generated || a.ID == "" || a.IdempotencyKey != a.ID || string(a.PayloadJSON) != `{"n":1}` ||
		string(a.HeadersJSON) != `{"h":"v"}` || !a.OccurredAt.Equal(now.Truncate(time.Microsecond)) || a.OccurredAt.Location() != time.UTC {
		t.Errorf("first event: %+v", a)
	}
	if b := out[1]; b.Generated || b.IdempotencyKey != "id" || string(b.PayloadJSON) != "null" || b.HeadersJSON != nil {
		t.Errorf("second event: %+v", b)
	}
	out, err = All(&Encoder{MaxPayload: DefaultMaxPayload}, []mine{{Type: "c"}}, []bool{false}, now)
	if err != nil || out[0].Generated {
		t.Errorf("generated given as false: %+v, %v", out, err)
	}
}
