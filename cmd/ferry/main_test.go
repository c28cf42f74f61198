package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every command a user can type has help text and an example (docs/cli.md promises it).
func TestEveryCommandHasHelpAndExample(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		if c.Short == "" {
			t.Errorf("%q has no short help", c.CommandPath())
		}
		if c.Example == "" {
			t.Errorf("%q has no example", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}

func TestParseKVs(t *testing.T) {
	t.Setenv("FERRY_TEST_FROM_ENV", "from-env")
	got, err := parseKVs("env", []string{"A=1", "B=x=y", "FERRY_TEST_FROM_ENV"})
	if err != nil {
		t.Fatal(err)
	}
	if got["A"] != "1" || got["B"] != "x=y" || got["FERRY_TEST_FROM_ENV"] != "from-env" {
		t.Errorf("parseKVs = %v", got)
	}
	for _, bad := range []string{"=v", "FERRY_TEST_SURELY_UNSET_VAR"} {
		if _, err := parseKVs("env", []string{bad}); err == nil {
			t.Errorf("parseKVs(%q) accepted", bad)
		}
	}
}

// TestCLIPlanReadsTheWindowLead: the CLI's own plan (serve up's table) takes the controller's
// window lead from FERRY_WINDOW_LEAD, as the controller it starts does; a bad value is an
// error naming the variable, not a silent default.
func TestCLIPlanReadsTheWindowLead(t *testing.T) {
	t.Setenv("FERRY_HOME", t.TempDir())
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("FERRY_WINDOW_LEAD", "ten minutes")
	if _, err := openInfras(); err == nil || !strings.Contains(err.Error(), "FERRY_WINDOW_LEAD") {
		t.Fatalf("openInfras with a bad FERRY_WINDOW_LEAD: %v, want an error naming it", err)
	}
	t.Setenv("FERRY_WINDOW_LEAD", "20m")
	s, err := openInfras()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
