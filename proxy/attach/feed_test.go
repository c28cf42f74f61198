package attach

import (
	"context"
	"testing"
	"time"

	"github.com/ferryserve/ferry/proxy"
)

// TestReplicaSetFeedWaitEndsWithContext: a poll whose caller gave up returns the current set.
func TestReplicaSetFeedWaitEndsWithContext(t *testing.T) {
	var feed Feed
	feed.Publish([]proxy.Backend{{ID: 1, Addr: "127.0.0.1:9001"}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rs := feed.Wait(ctx, feed.Seq(), time.Hour)
	if rs.Seq != feed.Seq() || len(rs.Backends) != 1 {
		t.Errorf("got %+v", rs)
	}
}
