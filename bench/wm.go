package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"gorm.io/gorm"
)

// wmExecutor lets watermill-sql's Publisher write through a GORM
// transaction: it is the transaction's connection, seen as watermill-sql's
// ContextExecutor.
type wmExecutor struct{ pool gorm.ConnPool }

func (w wmExecutor) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	return w.pool.ExecContext(ctx, q, args...)
}

func (w wmExecutor) QueryContext(ctx context.Context, q string, args ...any) (wmsql.Rows, error) {
	rows, err := w.pool.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return rows, nil
}

// wmCreateTables creates watermill-sql's messages and offsets tables for
// topic with its own DDL, outside any measurement.
func wmCreateTables(ctx context.Context, db *sql.DB, topic string) error {
	schema, err := wmsql.DefaultPostgreSQLSchema{}.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("watermill schema: %w", err)
	}
	offsets, err := wmsql.DefaultPostgreSQLOffsetsAdapter{}.SchemaInitializingQueries(wmsql.OffsetsSchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("watermill offsets schema: %w", err)
	}
	for _, q := range append(schema, offsets...) {
		if _, err := db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("watermill schema for %s: %w", topic, err)
		}
	}
	return nil
}

// wmLogger counts what watermill-sql logs. Its subscriber retries
// serialization failures ("concurrent update") silently at Debug level and
// logs other query errors at Error level; both are worth a note in the
// table.
type wmLogger struct {
	errors   *atomic.Int64
	retries  *atomic.Int64
	firstErr *atomic.Pointer[string]
}

func newWMLogger() wmLogger {
	return wmLogger{errors: new(atomic.Int64), retries: new(atomic.Int64), firstErr: new(atomic.Pointer[string])}
}

func (l wmLogger) Error(msg string, err error, _ watermill.LogFields) {
	l.errors.Add(1)
	s := fmt.Sprintf("%s: %v", msg, err)
	l.firstErr.CompareAndSwap(nil, &s)
}

func (l wmLogger) Info(string, watermill.LogFields) {}

func (l wmLogger) Debug(msg string, _ watermill.LogFields) {
	if msg == "Deadlock during querying message, trying again" {
		l.retries.Add(1)
	}
}

func (l wmLogger) Trace(string, watermill.LogFields) {}

func (l wmLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
