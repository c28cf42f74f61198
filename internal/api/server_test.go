package api

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTailOffset(t *testing.T) {
	tests := map[string]struct {
		content string
		n       int
		want    string
	}{
		"all":                 {"a\nb\nc\n", -1, "a\nb\nc\n"},
		"none":                {"a\nb\nc\n", 0, ""},
		"last line":           {"a\nb\nc\n", 1, "c\n"},
		"last two":            {"a\nb\nc\n", 2, "b\nc\n"},
		"more than there is":  {"a\nb\n", 5, "a\nb\n"},
		"no trailing newline": {"a\nb\nc", 1, "c"},
		"empty file":          {"", 3, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			off, err := tailOffset(f, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.content[off:]; got != tc.want {
				t.Errorf("tail %d of %q = %q, want %q", tc.n, tc.content, got, tc.want)
			}
		})
	}
}
