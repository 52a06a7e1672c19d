package encode

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"unicode/utf8"
)

// A payload is checked against what every supported database can store,
// before the INSERT: valid JSON that one of them refuses must be an
// ErrInvalidEvent, never a failed statement.

// maxJSONDepth is the deepest nesting of arrays and objects MariaDB's JSON
// column accepts (its json_valid check refuses 32 levels).
const maxJSONDepth = 31

// PostgreSQL's numeric, which jsonb stores numbers as, holds at most this
// many digits before and after the decimal point.
const (
	maxNumericWeight = 131072
	maxNumericScale  = 16383

	// PostgreSQL refuses exponents from 2^30-1 on, even on zero.
	maxNumericExponent = 1<<30 - 1
)

// checkStorableJSON rejects valid JSON that one of the databases refuses:
// PostgreSQL's jsonb refuses the escape \u0000, UTF-16 surrogate escapes
// that are not a proper pair, and numbers outside numeric's range; MariaDB
// refuses nesting deeper than 31 levels. The rule holds on every database,
// so an event accepted on SQLite is accepted on PostgreSQL and MySQL and a
// handler sees the same JSON on all of them; and it runs before the INSERT,
// because a failed statement aborts the caller's whole PostgreSQL
// transaction. The messages never quote the payload.
func checkStorableJSON(b []byte) error {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '[' || c == '{':
			if depth++; depth > maxJSONDepth {
				return fmt.Errorf("payload nests arrays and objects deeper than %d levels, which MariaDB's JSON cannot store", maxJSONDepth)
			}
		case c == ']' || c == '}':
			depth--
		case c == '"':
			end, err := checkString(b, i+1)
			if err != nil {
				return err
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			end, err := checkNumber(b, i)
			if err != nil {
				return err
			}
			i = end - 1
		}
	}
	return nil
}

// checkString scans the string starting after its opening quote at i and
// returns the index of its closing quote.
func checkString(b []byte, i int) (int, error) {
	for ; i < len(b) && b[i] != '"'; i++ {
		if b[i] != '\\' {
			continue
		}
		i++
		if i >= len(b) || b[i] != 'u' || i+4 >= len(b) {
			continue
		}
		r := hex4(b[i+1 : i+5])
		i += 4
		switch {
		case r == 0:
			return 0, errors.New(`payload contains \u0000, which PostgreSQL jsonb cannot store`)
		case r >= 0xD800 && r < 0xDC00:
			// A high surrogate must be followed by a low one.
			if i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
				if lo := hex4(b[i+3 : i+7]); lo >= 0xDC00 && lo < 0xE000 {
					i += 6
					continue
				}
			}
			return 0, errors.New("payload contains an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb cannot store")
		case r >= 0xDC00 && r < 0xE000:
			return 0, errors.New("payload contains an unpaired UTF-16 surrogate escape, which PostgreSQL jsonb cannot store")
		}
	}
	return i, nil
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r
}

// checkNumber scans the number starting at i and returns the index after it.
func checkNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	intStart := i
	i = skipDigits(b, i)
	intDigits := b[intStart:i]
	var frac []byte
	if i < len(b) && b[i] == '.' {
		start := i + 1
		i = skipDigits(b, start)
		frac = b[start:i]
	}
	exp := 0
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i, exp = scanExponent(b, i+1)
	}
	if !numericHolds(intDigits, frac, exp) {
		return 0, errNumberOutOfRange
	}
	return i, nil
}

// skipDigits returns the index of the first byte from i that is not a
// decimal digit.
func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// scanExponent scans an exponent's optional sign and digits, starting
// after its 'e' at i, and returns the index after it and its value,
// saturated at maxNumericExponent (anything beyond is out of range
// anyway).
func scanExponent(b []byte, i int) (int, int) {
	neg := i < len(b) && b[i] == '-'
	if neg || (i < len(b) && b[i] == '+') {
		i++
	}
	exp := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if exp < maxNumericExponent {
			exp = exp*10 + int(b[i]-'0')
		}
	}
	if neg {
		return i, -exp
	}
	return i, exp
}

// numericHolds reports whether PostgreSQL's numeric can hold the number
// with these integer and fraction digits and this exponent.
func numericHolds(intDigits, frac []byte, exp int) bool {
	if exp >= maxNumericExponent || exp <= -maxNumericExponent || len(frac)-exp > maxNumericScale {
		return false
	}
	weight, zero := numericWeight(intDigits, frac, exp)
	return zero || weight <= maxNumericWeight
}

// numericWeight returns the number's digits before the decimal point once
// the exponent is applied, or zero true when the number is zero.
func numericWeight(intDigits, frac []byte, exp int) (weight int, zero bool) {
	if len(intDigits) > 1 || (len(intDigits) == 1 && intDigits[0] != '0') {
		return len(intDigits) + exp, false
	}
	for k, c := range frac {
		if c != '0' {
			return exp - k, false
		}
	}
	return 0, true
}

var (
	errNotUTF8          = errors.New("payload is not valid UTF-8")
	errNumberOutOfRange = errors.New("payload contains a number outside PostgreSQL numeric's range")
)

// maxValidatorDepth is the nesting encoding/json's validator gives up at,
// calling deeper documents invalid.
const maxValidatorDepth = 10000

// nestingDepth returns how deeply b, which may be invalid JSON, nests
// arrays and objects, not counting brackets inside strings.
func nestingDepth(b []byte) int {
	depth, deepest := 0, 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case ']', '}':
			depth--
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		}
	}
	return deepest
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// hasInvalidUTF8 reports whether a string json.Marshal writes for v (a
// value, map key or text a TextMarshaler returns) holds invalid UTF-8. It
// walks what Marshal walks; a MarshalJSON's output is checked as bytes by
// the caller. depth guards against a structure Marshal would have refused
// as cyclic.
func hasInvalidUTF8(v reflect.Value, depth int) bool {
	if !v.IsValid() || depth > 1000 {
		return false
	}
	if invalid, marshaled := marshalerInvalidUTF8(v); marshaled {
		return invalid
	}
	switch v.Kind() {
	case reflect.String:
		return !utf8.ValidString(v.String())
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && hasInvalidUTF8(v.Elem(), depth+1)
	case reflect.Struct:
		return fieldsHaveInvalidUTF8(v, depth)
	case reflect.Map:
		return entriesHaveInvalidUTF8(v, depth)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return false // base64
		}
		return elemsHaveInvalidUTF8(v, depth)
	}
	return false
}

// marshalerInvalidUTF8 reports whether Marshal writes v with a marshaler
// (marshaled), and then whether the text a TextMarshaler returns holds
// invalid UTF-8; a MarshalJSON's output is the caller's to check.
func marshalerInvalidUTF8(v reflect.Value) (invalid, marshaled bool) {
	t := v.Type()
	if t.Implements(jsonMarshalerType) || (v.CanAddr() && reflect.PointerTo(t).Implements(jsonMarshalerType)) {
		return false, true
	}
	var m encoding.TextMarshaler
	switch {
	case t.Implements(textMarshalerType) && !(t.Kind() == reflect.Pointer && v.IsNil()):
		m = v.Interface().(encoding.TextMarshaler)
	case v.CanAddr() && reflect.PointerTo(t).Implements(textMarshalerType):
		// As encoding/json: a pointer receiver's MarshalText on an
		// addressable value.
		m = v.Addr().Interface().(encoding.TextMarshaler)
	default:
		return false, false
	}
	text, err := m.MarshalText()
	return err == nil && !utf8.Valid(text), true
}

// fieldsHaveInvalidUTF8 is hasInvalidUTF8 of the fields of the struct v
// that Marshal writes.
func fieldsHaveInvalidUTF8(v reflect.Value, depth int) bool {
	t := v.Type()
	for i := range v.NumField() {
		f := t.Field(i)
		if (f.IsExported() || f.Anonymous) && f.Tag.Get("json") != "-" && hasInvalidUTF8(v.Field(i), depth+1) {
			return true
		}
	}
	return false
}

// entriesHaveInvalidUTF8 is hasInvalidUTF8 of the keys and values of the
// map v.
func entriesHaveInvalidUTF8(v reflect.Value, depth int) bool {
	it := v.MapRange()
	for it.Next() {
		if hasInvalidUTF8(it.Key(), depth+1) || hasInvalidUTF8(it.Value(), depth+1) {
			return true
		}
	}
	return false
}

// elemsHaveInvalidUTF8 is hasInvalidUTF8 of the elements of the slice or
// array v.
func elemsHaveInvalidUTF8(v reflect.Value, depth int) bool {
	for i := range v.Len() {
		if hasInvalidUTF8(v.Index(i), depth+1) {
			return true
		}
	}
	return false
}
