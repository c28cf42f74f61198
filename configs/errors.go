package configs

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Error is one validation problem in a task file. Parse reports every problem it finds at once,
// each pointing at the line and column to fix, so that a user edits a file once rather than once
// per error; callers get them back with Errors.
type Error struct {
	// File is the name the task was read from ("" when parsed from memory without a name).
	File string
	// Line and Col are 1-based; 0 means the problem has no place in the file (a value from the
	// command line, or a YAML error yaml.v3 reports without a position).
	Line, Col int
	// Field is the dotted path of the offending field, e.g. "service.replica_policy.max_replicas"
	// or "resources.any_of[1].accelerators".
	Field string
	// Msg says what is wrong and, where it can, how to fix it.
	Msg string
}

// Error renders the problem the way compilers do ("file:line:col: field: message") so that
// editors and terminals can jump to it.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		if b.Len() > 0 {
			b.WriteByte(':')
		}
		b.WriteString(strconv.Itoa(e.Line))
		if e.Col > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Col))
		}
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors returns every *Error inside err, which may be a single *Error, an errors.Join of them,
// or either wrapped with %w. It returns nil when err holds none (for example a file that could
// not be read), so a caller can tell a bad file from a missing one.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case nil:
		case *Error:
			out = append(out, x)
		case interface{ Unwrap() []error }:
			for _, inner := range x.Unwrap() {
				walk(inner)
			}
		default:
			walk(errors.Unwrap(e))
		}
	}
	walk(err)
	return out
}

// checker walks one YAML document and collects every problem instead of stopping at the first.
type checker struct {
	file string
	// section is where the replica policy being read sits: "" for the service's own,
	// "service.pools.prefill" while a prefill pool's is read (pools.go).
	section string
	errs    []*Error
	// budget bounds the nodes visited, because YAML aliases let a small file describe a huge
	// (or, in yaml.v3's node tree, even cyclic) document.
	budget    int
	exhausted bool
	// lookupEnv is the user's environment under Load, nil under Parse. With it the checker also
	// reads the files a task names (service.auth.keys_file).
	lookupEnv func(string) (string, bool)
	// task says a task file is being read: unknown fields SkyPilot knows get its own message.
	taskFile bool
	// cwd is the directory the CLI runs in, under Load ("" under Parse): SkyPilot resolves a
	// service's relative TLS paths against it.
	cwd string
	// notes are what the task file says that Ferry accepted but reads its own way (notes.go).
	notes []Note
}

// maxNodeVisits is far above any real task file and far below what would take noticeable time.
const maxNodeVisits = 200_000

func newChecker(file string) *checker {
	return &checker{file: file, budget: maxNodeVisits}
}

// errorf records a problem at node n (nil when it has no place in the file).
func (c *checker) errorf(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: c.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	c.errs = append(c.errs, e)
}

// err returns the collected problems in file order, joined, or nil when there are none.
func (c *checker) err() error {
	if len(c.errs) == 0 {
		return nil
	}
	errs := c.errs
	if c.exhausted {
		// Everything after the budget ran out is noise from the nodes we stopped reading.
		errs = slices.DeleteFunc(slices.Clone(errs), func(e *Error) bool { return !strings.Contains(e.Msg, budgetMsg) })
	}
	slices.SortStableFunc(errs, func(a, b *Error) int {
		// Problems without a place (command-line values) go last.
		if (a.Line == 0) != (b.Line == 0) {
			if a.Line == 0 {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(a.Line, b.Line); c != 0 {
			return c
		}
		return cmp.Compare(a.Col, b.Col)
	})
	errs = slices.CompactFunc(errs, func(a, b *Error) bool { return *a == *b })
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e
	}
	return errors.Join(joined...)
}
