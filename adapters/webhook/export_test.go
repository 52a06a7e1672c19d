package webhook

import (
	"net/http"
	"testing"
)

// SetBeforeAck sets the hook run between a committed Consume and the
// response, until the test ends. Tests that set it must not run in
// parallel.
func SetBeforeAck(t testing.TB, f func(w http.ResponseWriter, r *http.Request)) {
	beforeAck = f
	t.Cleanup(func() { beforeAck = nil })
}
