package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/launcher"
)

// infraBackend answers the infra and teardown routes with what the test scripted.
type infraBackend struct {
	countingBackend
	health InfraHealth
	left   map[string][]launcher.Leftover // by service; a service not in it is unknown
}

func (b *infraBackend) Infras() InfraHealth { return b.health }

func (b *infraBackend) DeleteService(_ context.Context, name string) (DeleteServiceResult, error) {
	left, ok := b.left[name]
	if !ok {
		return DeleteServiceResult{}, fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	return DeleteServiceResult{LeftBehind: left}, nil
}

func newInfraServer(t *testing.T, b Backend) *Client {
	t.Helper()
	const token = "infra-route-test-token-0123456789"
	srv := httptest.NewServer(NewHandler(b, Tokens{Full: token}, zaptest.NewLogger(t)))
	t.Cleanup(srv.Close)
	return NewClient(srv.URL, token)
}

// TestInfrasRoute: GET /v1/infras carries the controller's breakers, error counts and
// leftovers to the client as they were; an empty view is empty lists, not nulls, so that
// scripts reading the JSON need no special case.
func TestInfrasRoute(t *testing.T) {
	since := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	health := InfraHealth{
		States: []launcher.InfraState{
			{Infra: "gcp", State: launcher.InfraDown, Since: since, RetryAt: since.Add(4 * time.Second), Failures: 3,
				LastClass: "unavailable", LastError: "infra unavailable: connection refused"},
			{Infra: "gcp", Zone: "us-central1-f", State: launcher.InfraDown, Since: since, Failures: 1, LastClass: "not_found", LastError: "zone not found"},
			{Infra: "local", State: launcher.InfraUp, Since: since.Add(-time.Hour)},
		},
		Errors: []InfraErrors{{Infra: "gcp", Class: "not_found", Count: 1}, {Infra: "gcp", Class: "unavailable", Count: 12}},
		Leftovers: []launcher.Leftover{
			{Key: "gcp/us-central1-a/chat-2", Infra: "gcp", InstanceID: "gcp/us-central1-a/chat-2", Owner: "service chat", Reason: "gcp down", Since: since},
			{Key: "select|gcp|ferry-service=chat|x", Infra: "gcp", Selector: map[string]string{"ferry-service": "chat"}, Before: since, Owner: "service chat", Since: since},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	got, err := newInfraServer(t, &infraBackend{health: health}).Infras(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(health, got); diff != "" {
		t.Errorf("Infras (-want +got):\n%s", diff)
	}
	if want := health.States[:2]; !cmp.Equal(want, got.NotUp()) {
		t.Errorf("NotUp = %v, want the two down breakers", got.NotUp())
	}

	// Nothing known yet: empty lists on the wire.
	c := newInfraServer(t, &infraBackend{})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/v1/infras", nil)
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"states":[],"errors":[],"leftovers":[]}`; strings.TrimSpace(string(body)) != want {
		t.Errorf("empty view = %s, want %s", body, want)
	}
}

// TestDeleteServiceSaysWhatIsLeft: serve down's answer carries what could not be stopped;
// a service with nothing left, an answer from an older controller ({"status":"deleted"}) and
// an answer with no body at all are nothing left; an unknown service is ErrNotFound.
func TestDeleteServiceSaysWhatIsLeft(t *testing.T) {
	since := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	left := []launcher.Leftover{{Key: "gcp/us-central1-a/chat-2", Infra: "gcp", InstanceID: "gcp/us-central1-a/chat-2", Owner: "service chat", Since: since}}
	c := newInfraServer(t, &infraBackend{left: map[string][]launcher.Leftover{"chat": left, "quiet": nil}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	res, err := c.DeleteService(ctx, "chat")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DeleteServiceResult{Status: "deleted", LeftBehind: left}, res); diff != "" {
		t.Errorf("chat (-want +got):\n%s", diff)
	}
	if res, err := c.DeleteService(ctx, "quiet"); err != nil || len(res.LeftBehind) != 0 || res.Status != "deleted" {
		t.Errorf("quiet: %+v, %v; want deleted with nothing left", res, err)
	}
	if _, err := c.DeleteService(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown service: %v, want ErrNotFound", err)
	}

	for name, answer := range map[string]string{"older controller": `{"status":"deleted"}` + "\n", "no body": ""} {
		old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodDelete || r.URL.Path != "/v1/services/chat" {
				http.NotFound(w, r)
				return
			}
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, answer)
		}))
		res, err := NewClient(old.URL, "t").DeleteService(ctx, "chat")
		old.Close()
		if err != nil || len(res.LeftBehind) != 0 {
			t.Errorf("%s: %+v, %v; want nothing left", name, res, err)
		}
	}
}
