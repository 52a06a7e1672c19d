//go:build cgo

package outboxtest_test

// cgoEnabled: gorm.io/driver/sqlite, which SQLite uses, works.
const cgoEnabled = true
