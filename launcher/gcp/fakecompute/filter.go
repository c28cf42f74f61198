package fakecompute

import (
	"fmt"
	"regexp"
	"strings"
)

// term is one comparison of a list filter: `labels.ferry-service = "chat"`.
type term struct {
	field, value string
	negate       bool
}

// termRE matches one comparison; the value is quoted or a bare word.
var termRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9_.\-]*)\s*(!=|=|eq|ne)\s*(?:"([^"]*)"|([^\s()"]+))`)

// parseFilter reads the subset of Compute's list filter syntax Ferry sends: comparisons, each
// optionally in parentheses, joined by whitespace or AND (Compute's default is AND). Anything
// else (OR, functions, regexps) is rejected, as a real but stricter server might.
func parseFilter(s string) ([]term, error) {
	var terms []term
	rest := s
	for _, m := range termRE.FindAllStringSubmatchIndex(s, -1) {
		value := ""
		if m[6] >= 0 {
			value = s[m[6]:m[7]]
		} else {
			value = s[m[8]:m[9]]
		}
		op := s[m[4]:m[5]]
		terms = append(terms, term{field: s[m[2]:m[3]], value: value, negate: op == "!=" || op == "ne"})
		rest = strings.Replace(rest, s[m[0]:m[1]], " ", 1)
	}
	left := strings.NewReplacer("(", " ", ")", " ", "AND", " ").Replace(rest)
	if strings.TrimSpace(left) != "" {
		return nil, fmt.Errorf("invalid list filter expression %q: unsupported syntax %q", s, strings.TrimSpace(left))
	}
	return terms, nil
}

// matches reports whether every term holds, reading fields through get (ok false: no such field).
func matches(terms []term, get func(field string) (string, bool)) (bool, error) {
	for _, t := range terms {
		v, ok := get(t.field)
		if !ok {
			return false, fmt.Errorf("invalid field name %q in list filter", t.field)
		}
		if (v == t.value) == t.negate {
			return false, nil
		}
	}
	return true, nil
}
