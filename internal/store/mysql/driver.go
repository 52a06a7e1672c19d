package mysql

import (
	"database/sql/driver"
	"errors"
	"reflect"
)

// The store reads what it needs of github.com/go-sql-driver/mysql (GORM's
// MySQL driver) by reflection rather than importing it, so that a program
// that uses another database links no MySQL driver.

const driverPkg = "github.com/go-sql-driver/mysql"

// errorNumber is the server's error number of err, the Number field of
// the driver's *MySQLError in err's chain, if there is one.
func errorNumber(err error) (uint16, bool) {
	for _, e := range chain(err) {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Pointer || v.IsNil() {
			continue
		}
		v = v.Elem()
		if t := v.Type(); t.PkgPath() != driverPkg || t.Name() != "MySQLError" {
			continue
		}
		if f := v.FieldByName("Number"); f.IsValid() && f.CanUint() {
			return uint16(f.Uint()), true
		}
	}
	return 0, false
}

// isError reports whether err is the server's error of one of the numbers.
func isError(err error, numbers ...uint16) bool {
	n, ok := errorNumber(err)
	if !ok {
		return false
	}
	for _, want := range numbers {
		if n == want {
			return true
		}
	}
	return false
}

// chain is err and every error it wraps, depth first, as errors.As walks
// them.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, w := range u.Unwrap() {
				walk(w)
			}
		default:
			walk(errors.Unwrap(e))
		}
	}
	walk(err)
	return out
}

// isDriver reports whether d is the driver's *MySQLDriver.
func isDriver(d driver.Driver) bool {
	t := reflect.TypeOf(d)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == driverPkg && t.Elem().Name() == "MySQLDriver"
}
