package configs

import (
	"cmp"
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"
)

// Note is something Ferry accepted in a task file but reads differently from how it is written,
// or cannot act on everywhere: a deprecated spelling, an alternative on a cloud Ferry does not
// launch on (dropped from the plan), a name made DNS-safe. A note never stops a launch; the CLI
// prints every note with the plan, so that --dry-run says what it did instead of doing it
// silently. It has an Error's shape and renders the same way (file:line:col: field: message).
type Note struct {
	File      string
	Line, Col int
	Field     string
	Msg       string
}

// String renders the note as "file:line:col: field: message", as Error does.
func (n Note) String() string {
	e := Error(n)
	return e.Error()
}

// notef records a note at node n (nil when it has no place in the file).
func (c *checker) notef(n *yaml.Node, field, format string, args ...any) {
	note := Note{File: c.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		note.Line, note.Col = n.Line, n.Column
	}
	c.notes = append(c.notes, note)
}

// sortedNotes returns the notes in file order (those without a place last), duplicates removed.
func (c *checker) sortedNotes() []Note {
	if len(c.notes) == 0 {
		return nil
	}
	out := slices.Clone(c.notes)
	slices.SortStableFunc(out, func(a, b Note) int {
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
	return slices.Compact(out)
}
