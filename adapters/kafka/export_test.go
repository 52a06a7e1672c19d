package kafka

// SetBeforeAck sets c's hook that runs after a record's transaction
// committed and before its offset may be committed; a non-nil error from
// it stops Run there, as a crash would.
func SetBeforeAck(c *Consumer, f func(Message) error) { c.beforeAck = f }
