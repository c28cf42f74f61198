// Package testhttp holds HTTP helpers that tests in several packages share (the CLI's and
// the end-to-end tests). Only test code imports it.
package testhttp

import (
	"io"
	"net/http"
	"testing"
)

// GetOK returns the body of GET url, failing the test unless the answer is 200.
func GetOK(t testing.TB, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, raw)
	}
	return string(raw)
}
