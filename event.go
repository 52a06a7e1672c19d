package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
)

// PayloadJSON returns the payload as JSON: the bytes a handler received (a
// json.RawMessage), or, for an Event built by hand, the encoding Publish
// would store. Errors never quote the payload.
func (e Event) PayloadJSON() ([]byte, error) {
	var b []byte
	switch p := e.Payload.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		enc, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("%w: encode payload: %w", ErrInvalidEvent, err)
		}
		return enc, nil
	}
	if b == nil {
		return []byte("null"), nil
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, errors.New("payload bytes are not valid JSON"))
	}
	return b, nil
}
