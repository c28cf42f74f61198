package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// load is a steady closed loop of non-streamed chat completions against one endpoint: two
// clients, bounded in count and time, counting what failed.
type load struct {
	// gate is held for reading by each request and for writing while the load is paused.
	gate     sync.RWMutex
	mu       sync.Mutex
	sent     int
	failed   int
	firstErr string
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// loadCounts is a load's counts at one moment.
type loadCounts struct {
	sent, failed int
	firstErr     string
}

const (
	loadClients   = 2
	loadMaxEach   = 200000
	loadMaxTime   = time.Hour
	loadReqBudget = 30 * time.Second
)

func startLoad(endpoint string) *load {
	l := &load{done: make(chan struct{})}
	client := &http.Client{Timeout: loadReqBudget}
	body := `{"model":"infrafaults-sim","messages":[{"role":"user","content":"steady"}],"max_tokens":4}`
	deadline := time.Now().Add(loadMaxTime)
	for range loadClients {
		l.wg.Go(func() {
			for range loadMaxEach {
				select {
				case <-l.done:
					return
				default:
				}
				if time.Now().After(deadline) {
					return
				}
				l.gate.RLock()
				err := post(client, endpoint, body)
				l.gate.RUnlock()
				l.mu.Lock()
				l.sent++
				if err != nil {
					l.failed++
					if l.firstErr == "" {
						l.firstErr = err.Error()
					}
				}
				l.mu.Unlock()
				time.Sleep(20 * time.Millisecond) // a steady trickle, not a flood
			}
		})
	}
	return l
}

// post sends one completion and checks it succeeded.
func post(client *http.Client, endpoint, body string) error {
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	return nil
}

func (l *load) snapshot() loadCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return loadCounts{l.sent, l.failed, l.firstErr}
}

// stop ends the load, lets requests in flight finish, and returns the counts.
func (l *load) stop() loadCounts {
	l.once.Do(func() { close(l.done) })
	l.wg.Wait()
	return l.snapshot()
}

// pause waits for the requests in flight and holds the next ones until resume: for a
// controller restart, which takes its own endpoints down (an attached proxy would keep them).
func (l *load) pause() { l.gate.Lock() }

// resume lets a paused load go on.
func (l *load) resume() { l.gate.Unlock() }
