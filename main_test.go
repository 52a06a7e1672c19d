package outbox

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind: a relay that
// does not stop, a listener that outlives Run. The NOTIFY sender stops
// 250 ms after its last wake-up, within goleak's retries.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopsServers{m},
		// GORM's prepared-statement cache starts a janitor it never stops.
		goleak.IgnoreAnyFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"),
	)
}

// stopsServers stops the PostgreSQL servers the tests started once they
// are done.
type stopsServers struct{ m *testing.M }

func (s stopsServers) Run() int {
	code := s.m.Run()
	stopLogicalServer()
	return code
}
