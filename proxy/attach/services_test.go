package attach

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/rpc"
)

// feedLister serves the list route from a real ServiceFeed.
type feedLister struct{ feed ServiceFeed }

func (l *feedLister) ListServices(ctx context.Context, after uint64, wait time.Duration) ServiceList {
	return l.feed.Wait(ctx, after, wait)
}

// startListServer serves the list route behind the controller's and the attach token; c holds
// the attach token.
func startListServer(t *testing.T) (*feedLister, *rpc.Client) {
	t.Helper()
	l := &feedLister{}
	srv := httptest.NewServer(rpc.NewHandler(rpc.Tokens{Full: "controller-test-token", Attach: attachToken},
		ServiceListRoutes(l, zaptest.NewLogger(t))))
	t.Cleanup(srv.Close)
	return l, rpc.NewClient(srv.URL, attachToken)
}

func TestServiceFeedMovesOnlyOnChange(t *testing.T) {
	var feed ServiceFeed
	if feed.Seq() != 0 {
		t.Fatalf("Seq %d before any Publish", feed.Seq())
	}
	steps := []struct {
		publish   []string
		wantNames []string
		wantMoved bool
	}{
		{publish: nil, wantNames: []string{}, wantMoved: true}, // the first list, even empty
		{publish: []string{}, wantNames: []string{}, wantMoved: false},
		{publish: []string{"b", "a"}, wantNames: []string{"a", "b"}, wantMoved: true},
		{publish: []string{"a", "b", "a"}, wantNames: []string{"a", "b"}, wantMoved: false},
		{publish: []string{"a"}, wantNames: []string{"a"}, wantMoved: true},
	}
	for i, step := range steps {
		before := feed.Seq()
		feed.Publish(step.publish)
		if moved := feed.Seq() != before; moved != step.wantMoved {
			t.Errorf("step %d (%v): Seq moved %v, want %v", i, step.publish, moved, step.wantMoved)
		}
		got := feed.Wait(context.Background(), 0, 0)
		if diff := cmp.Diff(ServiceList{Seq: feed.Seq(), Services: step.wantNames}, got); diff != "" {
			t.Errorf("step %d (%v) (-want +got):\n%s", i, step.publish, diff)
		}
	}
}

func TestServiceListLongPoll(t *testing.T) {
	l, c := startListServer(t)

	// Nothing published: Seq 0, no names, at once with wait=0.
	list, err := PollServices(testCtx(t), c, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ServiceList{Services: []string{}}, list); diff != "" {
		t.Fatalf("before any list (-want +got):\n%s", diff)
	}

	l.feed.Publish([]string{"llama", "mistral"})
	list, err = PollServices(testCtx(t), c, 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := (ServiceList{Seq: l.feed.Seq(), Services: []string{"llama", "mistral"}}); !cmp.Equal(want, list) {
		t.Fatalf("got %+v, want %+v at once", list, want)
	}

	// A poll at the current Seq waits for the next change.
	got := make(chan ServiceList, 1)
	go func() {
		next, err := PollServices(testCtx(t), c, list.Seq, time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- next
	}()
	select {
	case early := <-got:
		t.Fatalf("the poll answered %+v before any change", early)
	case <-time.After(100 * time.Millisecond):
	}
	l.feed.Publish([]string{"llama"})
	select {
	case next := <-got:
		if next.Seq != list.Seq+1 || !cmp.Equal(next.Services, []string{"llama"}) {
			t.Errorf("after the change: %+v", next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the poll did not answer the change")
	}
}

func TestServiceListRouteRefuses(t *testing.T) {
	_, c := startListServer(t)
	for _, token := range []string{"", "wrong"} {
		if _, err := PollServices(testCtx(t), rpc.NewClient(c.Base, token), 0, 0); !errors.Is(err, rpc.ErrUnauthorized) {
			t.Errorf("token %q: %v, want ErrUnauthorized", token, err)
		}
	}
	for _, query := range []string{"?after=x", "?wait=-1"} {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, c.Base+ServiceListPath+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+attachToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: HTTP %d, want 400", query, resp.StatusCode)
		}
	}
}
