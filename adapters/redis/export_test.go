package redis

// SetBeforeAck sets the hook that runs right before a committed message's
// XACK, and returns a function that removes it. Tests that set it must not
// run in parallel with others that consume.
func SetBeforeAck(f func(m Message)) (restore func()) {
	beforeAck = f
	return func() { beforeAck = nil }
}
