//go:build !cgo

package outboxtest_test

// cgoEnabled: without cgo, gorm.io/driver/sqlite, which SQLite uses, is a
// stub that fails to open.
const cgoEnabled = false
