package attach

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
)

// controllerConn finds the controller through FERRY_HOME: its socket or address in the info
// file and the attach token beside it (home.AttachToken), read again after forget (a
// restarted controller listens elsewhere).
type controllerConn struct {
	home home.Home

	mu   sync.Mutex
	c    *api.Client
	addr string
}

func (cc *controllerConn) client() (*api.Client, string, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.c != nil {
		return cc.c, cc.addr, nil
	}
	info, err := cc.home.ReadInfo()
	if err != nil {
		return nil, "", fmt.Errorf("no controller address in %s: %w", cc.home.InfoPath(), err)
	}
	token, err := cc.home.AttachToken()
	if err != nil {
		return nil, "", err
	}
	c, err := api.ClientFor(cc.home, info, token)
	if err != nil {
		return nil, "", err
	}
	cc.c, cc.addr = c, c.Where
	return cc.c, cc.addr, nil
}

// forget makes the next client() read FERRY_HOME again.
func (cc *controllerConn) forget() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.c = nil
}

// newProxyID is random per process, so the controller tells a restarted proxy from the old.
func newProxyID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
