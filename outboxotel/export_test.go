package outboxotel

import "github.com/gorm-outbox/outbox"

// InstrumentCounting is Instrument, also returning how many create spans
// wait for their event's Stored hook: none once every Publish has
// returned.
func InstrumentCounting(ob *outbox.Outbox, opts ...Option) (waiting func() int, err error) {
	in, err := instrument(ob, opts...)
	if err != nil {
		return nil, err
	}
	return func() int {
		n := 0
		in.creating.Range(func(any, any) bool { n++; return true })
		return n
	}, nil
}
