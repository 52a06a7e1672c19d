package outbox

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// refusalTests check what callers are told when the outbox refuses work:
// an error must never come with a commit the caller would repeat.
var refusalTests = map[string]func(*testing.T, backend){
	"AfterCommitRefusedCommitsNothing": testAfterCommitRefusedCommitsNothing,
}

// testAfterCommitRefusedCommitsNothing: AfterCommit on a transaction whose
// commit the plugin cannot see (no plugin on the *gorm.DB, or a
// transaction begun inside db.Connection) cannot run its function. The
// transaction must then not commit: db.Transaction returning an error with
// the business row committed invites a retry that writes it twice.
func testAfterCommitRefusedCommitsNothing(t *testing.T, b backend) {
	bare := b.open(t, &gorm.Config{})
	require.NoError(t, bare.AutoMigrate(&Order{}))
	e := b.setup(t)
	for _, tc := range []struct {
		name string
		db   *gorm.DB
		want error
		run  func(db *gorm.DB, fn func()) error
	}{
		{"NoPlugin", bare, ErrNotInstalled, func(db *gorm.DB, fn func()) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&Order{Total: 1}).Error; err != nil {
					return err
				}
				AfterCommit(tx, fn)
				return nil
			})
		}},
		{"NoPluginWritesAfter", bare, ErrNotInstalled, func(db *gorm.DB, fn func()) error {
			return db.Transaction(func(tx *gorm.DB) error {
				AfterCommit(tx, fn)
				_ = tx.Create(&Order{Total: 2}).Error // the caller ignores this error too
				return nil
			})
		}},
		{"NoPluginNested", bare, nil, func(db *gorm.DB, fn func()) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&Order{Total: 3}).Error; err != nil {
					return err
				}
				return tx.Transaction(func(inner *gorm.DB) error {
					AfterCommit(inner, fn)
					return nil
				})
			})
		}},
		{"Untracked", e.db, ErrUntrackedTransaction, func(db *gorm.DB, fn func()) error {
			return db.Connection(func(conn *gorm.DB) error {
				return conn.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&Order{Total: 4}).Error; err != nil {
						return err
					}
					AfterCommit(tx, fn)
					return nil
				})
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before int64
			require.NoError(t, tc.db.Model(&Order{}).Count(&before).Error)
			ran := false
			err := tc.run(tc.db, func() { ran = true })
			require.Error(t, err, "the function can never run: Transaction must say so")
			if tc.want != nil {
				assert.ErrorIs(t, err, tc.want)
			}
			var after int64
			require.NoError(t, tc.db.Model(&Order{}).Count(&after).Error)
			assert.Equal(t, before, after, "Transaction returned %v and committed the business row", err)
			assert.False(t, ran)
		})
	}
}
