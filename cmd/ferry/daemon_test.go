package main

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/internal/home"
)

// TestDaemonEnv: the controller the CLI starts keeps what it needs of the CLI's environment
// (its settings, cloud and cluster credentials, what replicas inherit, its runtime's knobs) and
// none of the rest, secrets in the user's shell included; FERRY_HOME is the home it serves.
func TestDaemonEnv(t *testing.T) {
	cli := []string{
		"PATH=/usr/bin", "HOME=/home/u", "LANG=C.UTF-8", "LC_ALL=C", "TMPDIR=/tmp/u", "USER=u",
		"FERRY_HOME=/elsewhere", "FERRY_GATEWAY_ADDR=off",
		"AWS_ACCESS_KEY_ID=AKIA", "AWS_PROFILE=prod", "GOOGLE_APPLICATION_CREDENTIALS=/k.json", "KUBECONFIG=/kc",
		"HTTPS_PROXY=http://proxy:3128", "GODEBUG=x=1",
		"CUDA_VISIBLE_DEVICES=0,1", "LD_LIBRARY_PATH=/usr/local/cuda/lib64",
		"CHAT_KEY=sk-secret-key-0123456789", "OPENAI_API_KEY=sk-other", "GITHUB_TOKEN=ghp_x", "HF_TOKEN=hf_x",
		"SSH_AUTH_SOCK=/tmp/agent", "DATABASE_URL=postgres://u:p@db/x",
	}
	got := daemonEnv(cli, home.Home{Dir: "/home/u/.ferry"})
	want := []string{
		"PATH=/usr/bin", "HOME=/home/u", "LANG=C.UTF-8", "LC_ALL=C", "TMPDIR=/tmp/u", "USER=u",
		"FERRY_GATEWAY_ADDR=off",
		"AWS_ACCESS_KEY_ID=AKIA", "AWS_PROFILE=prod", "GOOGLE_APPLICATION_CREDENTIALS=/k.json", "KUBECONFIG=/kc",
		"HTTPS_PROXY=http://proxy:3128", "GODEBUG=x=1",
		"CUDA_VISIBLE_DEVICES=0,1", "LD_LIBRARY_PATH=/usr/local/cuda/lib64",
		"FERRY_HOME=/home/u/.ferry",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("daemon environment (-want +got):\n%s", diff)
	}
	if slices.ContainsFunc(got, func(kv string) bool { return kv == "FERRY_HOME=/elsewhere" }) {
		t.Error("the CLI's FERRY_HOME survived next to the home being served")
	}
}
