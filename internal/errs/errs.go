// Package errs holds the sentinel errors the internal packages wrap and
// the root package exports under the same values, so that errors.Is on an
// error from any layer matches the public sentinel. Their documentation is
// the root package's (errors.go).
package errs

import "errors"

var (
	ErrInvalidEvent       = errors.New("outbox: invalid event")
	ErrIDConflict         = errors.New("outbox: event ID taken by another event")
	ErrInvalidConfig      = errors.New("outbox: invalid config")
	ErrUnsupportedDialect = errors.New("outbox: unsupported database dialect")
	ErrUnsupportedVersion = errors.New("outbox: unsupported database server version")
	ErrServerSetting      = errors.New("outbox: database server setting the outbox cannot work with")
	ErrPrivilege          = errors.New("outbox: database role lacks a privilege the outbox needs")
	ErrNoSlot             = errors.New("outbox: the replication slot does not exist; the event would be lost")
	ErrUnsupportedFeature = errors.New("outbox: the database's store does not support this feature")
)

// ErrReplicasBehind is the root's ErrReplicasBehind (RelayConfig.WaitReplicas).
var ErrReplicasBehind = errors.New("outbox: the standbys have not flushed the batch's WAL")
