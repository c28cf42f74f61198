package vmnode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
)

// scriptedLog is a PolledLog whose reads return reads in turn and whose instance has ended
// from read endedAt on.
type scriptedLog struct {
	reads   []string
	errs    map[int]error // read index -> its error
	endedAt int
	n       int
}

var _ PolledLog = (*scriptedLog)(nil)

func (l *scriptedLog) Read(context.Context) (string, error) {
	i := l.n
	l.n++
	if err := l.errs[i]; err != nil {
		return "", err
	}
	if i >= len(l.reads) {
		return "", nil
	}
	return l.reads[i], nil
}

func (l *scriptedLog) Ended(context.Context) (bool, error) { return l.n >= l.endedAt, nil }

func TestStreamPolledLog(t *testing.T) {
	for name, tc := range map[string]struct {
		log     *scriptedLog
		opts    launcher.LogOptions
		want    string
		wantErr error
	}{
		"tail only": {
			log:  &scriptedLog{reads: []string{"1\n2\n3\n", "4\n"}, endedAt: 99},
			opts: launcher.LogOptions{Tail: 2},
			want: "2\n3\n",
		},
		"follow until ended, with the last output": {
			log:  &scriptedLog{reads: []string{"1\n2\n", "3\n", "", "4\n"}, endedAt: 3},
			opts: launcher.LogOptions{Tail: 1, Follow: true},
			want: "2\n3\n4\n",
		},
		"follow until gone": {
			log:  &scriptedLog{reads: []string{"1\n", "2\n"}, errs: map[int]error{2: io.EOF}, endedAt: 99},
			opts: launcher.LogOptions{Tail: -1, Follow: true},
			want: "1\n2\n",
		},
		"first read fails": {
			log:     &scriptedLog{errs: map[int]error{0: launcher.ErrNotFound}},
			opts:    launcher.LogOptions{Tail: -1, Follow: true},
			wantErr: launcher.ErrNotFound,
		},
		"later read fails": {
			log:     &scriptedLog{reads: []string{"1\n"}, errs: map[int]error{1: launcher.ErrUnauthorized}, endedAt: 99},
			opts:    launcher.LogOptions{Tail: -1, Follow: true},
			want:    "1\n",
			wantErr: launcher.ErrUnauthorized,
		},
	} {
		t.Run(name, func(t *testing.T) {
			var w bytes.Buffer
			err := StreamPolledLog(context.Background(), tc.log, tc.opts, time.Millisecond, &w)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("StreamPolledLog: %v, want %v", err, tc.wantErr)
			}
			if d := cmp.Diff(tc.want, w.String()); d != "" {
				t.Fatalf("written (-want +got):\n%s", d)
			}
		})
	}
}

func TestTailLines(t *testing.T) {
	for n, want := range map[int]string{-1: "1\n2\n3\n", 0: "", 2: "2\n3\n", 5: "1\n2\n3\n"} {
		if got := tailLines("1\n2\n3\n", n); got != want {
			t.Errorf("tailLines(%d) = %q, want %q", n, got, want)
		}
	}
	if got := tailLines("1\n2", 1); got != "2" {
		t.Errorf("tailLines of an unfinished line = %q, want %q", got, "2")
	}
}
