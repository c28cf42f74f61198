package provision

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// logFile is a scripted provider that keeps its instances' logs in local files.
type logFile struct{ *scripted }

func (logFile) LogPath(id string) (string, error) { return "/logs/" + id, nil }

// logAPI is a scripted provider whose instances' output only its API reads.
type logAPI struct{ *scripted }

func (logAPI) LogHint(id string) string { return "cloud logs " + id }

func (logAPI) StreamLogs(_ context.Context, id string, _ launcher.LogOptions, w io.Writer) error {
	_, err := io.WriteString(w, "output of "+id)
	return err
}

// Each per-instance capability reaches the provider that owns the instance, and only when it
// has it; an infra that is down is not asked to stream.
func TestCapabilitiesReachTheOwner(t *testing.T) {
	p, err := New(Options{Infras: []Infra{
		{Name: "local", Provider: logFile{&scripted{infra: "local"}}},
		{Name: "aws", Provider: logAPI{&scripted{infra: "aws"}}},
		{Name: "gcp", Provider: &scripted{infra: "gcp"}},
	}, Planner: PlannerFunc(func(context.Context, configs.Resources) ([]launcher.Placement, error) { return nil, nil })})
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]struct {
		wantPath string
		wantErr  string // "" for none
	}{
		"local-1":  {wantPath: "/logs/local-1"},
		"aws/i-1":  {wantErr: "read it with: cloud logs aws/i-1"},
		"gcp/vm-1": {wantErr: "gcp keeps no local log for gcp/vm-1"},
	}
	for id, tc := range paths {
		path, err := p.LogPath(id)
		if path != tc.wantPath || (tc.wantErr == "") != (err == nil) || (err != nil && (!strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, launcher.ErrNotFound))) {
			t.Errorf("LogPath(%s) = %q, %v; want %q, %q", id, path, err, tc.wantPath, tc.wantErr)
		}
	}
	if _, err := p.LogPath("azure/x"); err == nil {
		t.Error("LogPath of an instance no infra owns: no error")
	}

	var out strings.Builder
	if err := p.StreamLogs(context.Background(), "aws/i-1", launcher.LogOptions{}, &out); err != nil || out.String() != "output of aws/i-1" {
		t.Errorf("StreamLogs(aws/i-1) wrote %q, %v", out.String(), err)
	}
	if err := p.StreamLogs(context.Background(), "gcp/vm-1", launcher.LogOptions{}, io.Discard); !errors.Is(err, launcher.ErrNotFound) {
		t.Errorf("StreamLogs(gcp/vm-1) = %v, want ErrNotFound", err)
	}
	for range 3 {
		p.Health().Observe("aws", "", launcher.ErrUnavailable)
	}
	out.Reset()
	if err := p.StreamLogs(context.Background(), "aws/i-1", launcher.LogOptions{}, &out); err == nil || out.Len() > 0 {
		t.Errorf("StreamLogs on a down infra wrote %q, %v; want its breaker's error", out.String(), err)
	}
}
