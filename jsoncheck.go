package outbox

import (
	"errors"
	"fmt"
)

// A payload is checked against what every supported database can store,
// before the INSERT: valid JSON that one of them refuses must be an
// ErrInvalidEvent, never a failed statement.

// maxJSONDepth is the deepest nesting of arrays and objects MariaDB's JSON
// column accepts (its json_valid check refuses 32 levels).
const maxJSONDepth = 31

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
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	intDigits := b[intStart:i]
	var frac []byte
	if i < len(b) && b[i] == '.' {
		i++
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		frac = b[start:i]
	}
	exp := 0
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			neg = b[i] == '-'
			i++
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if exp < maxNumericExponent { // saturate: anything beyond is out of range anyway
				exp = exp*10 + int(b[i]-'0')
			}
			i++
		}
		if neg {
			exp = -exp
		}
	}
	outOfRange := errors.New("payload contains a number outside PostgreSQL numeric's range")
	if exp >= maxNumericExponent || exp <= -maxNumericExponent || len(frac)-exp > maxNumericScale {
		return 0, outOfRange
	}
	// weight: digits before the decimal point once the exponent is applied.
	weight, zero := 0, true
	if len(intDigits) > 1 || (len(intDigits) == 1 && intDigits[0] != '0') {
		weight, zero = len(intDigits)+exp, false
	} else {
		for k, c := range frac {
			if c != '0' {
				weight, zero = exp-k, false
				break
			}
		}
	}
	if !zero && weight > maxNumericWeight {
		return 0, outOfRange
	}
	return i, nil
}
