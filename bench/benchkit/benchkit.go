// Package benchkit holds what the benchmark drivers in bench/ share: their command-line entry
// point, markdown tables and free loopback ports.
package benchkit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// Main parses args with parse and runs the driver, exiting 2 on a flag error, 1 when run fails,
// and 0 after --help. Errors are printed as "name: error".
func Main[O any](name string, args []string, parse func([]string) (O, error), run func(O) error) {
	opts, err := parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Table is a markdown table whose columns are padded so that it also reads well in a terminal.
type Table struct {
	Header []string
	Rows   [][]string
}

// Render writes the table: header, separator, rows. Widths count runes, so "µs" and "÷" pad
// like any other character.
func (t *Table) Render(w io.Writer) {
	width := make([]int, len(t.Header))
	for i, h := range t.Header {
		width[i] = len([]rune(h))
	}
	for _, row := range t.Rows {
		for i, c := range row {
			if i < len(width) {
				width[i] = max(width[i], len([]rune(c)))
			}
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			if i < len(width) {
				fmt.Fprintf(&b, " %-*s |", width[i], c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
	line(t.Header)
	sep := make([]string, len(width))
	for i, n := range width {
		sep[i] = strings.Repeat("-", n)
	}
	line(sep)
	for _, row := range t.Rows {
		line(row)
	}
}

// FreeLoopbackAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func FreeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
