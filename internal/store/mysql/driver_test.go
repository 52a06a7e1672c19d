package mysql

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
)

// TestDriverByReflection: the store reads the driver's error numbers and
// driver type without importing the driver; wrapped, joined or not.
func TestDriverByReflection(t *testing.T) {
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
	assert.True(t, isError(deadlock, 1213))
	assert.True(t, isError(fmt.Errorf("claim: %w", deadlock), 1205, 1213))
	assert.True(t, isError(errors.Join(errors.New("other"), fmt.Errorf("x: %w", deadlock)), 1213))
	assert.False(t, isError(deadlock, 1064))
	assert.False(t, isError(errors.New("1213"), 1213))
	assert.False(t, isError(nil, 1213))
	n, ok := errorNumber(&mysql.MySQLError{Number: 1064})
	assert.True(t, ok)
	assert.Equal(t, uint16(1064), n)

	assert.True(t, isDriver(&mysql.MySQLDriver{}))
	assert.False(t, isDriver(nil))
}
