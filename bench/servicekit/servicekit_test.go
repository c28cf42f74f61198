package servicekit

import (
	"testing"
	"time"
)

func TestEndpointAddr(t *testing.T) {
	if got, err := EndpointAddr("http://127.0.0.1:30001"); err != nil || got != "127.0.0.1:30001" {
		t.Errorf("EndpointAddr = %q, %v", got, err)
	}
	if _, err := EndpointAddr("127.0.0.1:30001"); err == nil {
		t.Error("EndpointAddr accepted a host:port without a scheme")
	}
}

func TestLines(t *testing.T) {
	if got := LastLines("a\n\n b \nc\n", 2); got != "b / c" {
		t.Errorf("LastLines = %q", got)
	}
	if got := FirstLine("\n  ⚙︎ Started the controller\nx"); got != "⚙︎ Started the controller" {
		t.Errorf("FirstLine = %q", got)
	}
}

func TestLoadStopTwice(t *testing.T) {
	n := 0
	twoDone := make(chan struct{})
	l := StartLoad(1, time.Minute, func(bool) (int, error) {
		n++
		if n == 3 {
			close(twoDone) // two records kept before this call returns
		}
		return n, nil
	})
	<-twoDone
	first, _ := l.Stop()
	second, _ := l.Stop()
	if len(first) < 2 || len(first) != len(second) {
		t.Errorf("Stop returned %d records, then %d; want the same, at least 2", len(first), len(second))
	}
}
