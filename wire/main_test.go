package wire_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// GORM's prepared-statement cache starts a janitor it never stops.
		goleak.IgnoreAnyFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"),
	)
}
