package controller

import (
	"errors"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
)

// TestCheckAuth: the controller refuses, as invalid, a service.auth the CLI did not resolve and
// one that takes its key from an env (which the store keeps and status returns as written),
// whoever sent it.
func TestCheckAuth(t *testing.T) {
	hashes := []string{configs.HashAPIKey("sk-0123456789abcdef")}
	tests := map[string]struct {
		task    *configs.Task
		wantErr bool
	}{
		"no auth": {task: &configs.Task{Service: &configs.Service{}}},
		"key from a secret": {task: &configs.Task{Secrets: map[string]string{"K": "sk-0123456789abcdef"},
			Service: &configs.Service{Auth: &configs.Auth{KeysFromEnv: []string{"K"}, KeyHashes: hashes}}}},
		"unresolved": {task: &configs.Task{Service: &configs.Service{Auth: &configs.Auth{KeysFromEnv: []string{"K"}}}}, wantErr: true},
		"key from an env": {task: &configs.Task{Envs: map[string]string{"K": "sk-0123456789abcdef"},
			Service: &configs.Service{Auth: &configs.Auth{KeysFromEnv: []string{"K"}, KeyHashes: hashes}}}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := checkAuth(tc.task)
			if tc.wantErr != errors.Is(err, api.ErrInvalid) || (!tc.wantErr && err != nil) {
				t.Fatalf("checkAuth = %v, want error: %v", err, tc.wantErr)
			}
		})
	}
}
