package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/ferryserve/ferry/launcher"
)

// An infra that fails must be visible where people look (docs/placement.md, "When an infra
// fails"): the controller's breakers, the errors it counted and what it could not stop are read
// from its memory, never from an infra, so that asking answers at once while an infra hangs.

// InfraHealth is the controller's view of its infras: `ferry check` shows it, `jobs queue`
// and `serve status -v` show parts of it.
type InfraHealth struct {
	// States are the breakers: each infra ("" Zone), then each zone or region Ferry has
	// heard from, by name.
	States []launcher.InfraState `json:"states"`
	// Errors count the failures of each class on each infra since the controller started,
	// by infra then class.
	Errors []InfraErrors `json:"errors"`
	// Leftovers are what teardowns could not stop on an infra that did not answer: Ferry stops
	// them when it answers again. Oldest first.
	Leftovers []launcher.Leftover `json:"leftovers"`
}

// InfraErrors counts one class of failure (provision.Class*: unavailable, throttled,
// timeout, ...) on one infra.
type InfraErrors struct {
	Infra string `json:"infra"`
	Class string `json:"class"`
	Count uint64 `json:"count"`
}

// NotUp are the states of infras or zones that do not take calls now (down or throttled).
func (h InfraHealth) NotUp() []launcher.InfraState {
	var out []launcher.InfraState
	for _, s := range h.States {
		if s.State != launcher.InfraUp {
			out = append(out, s)
		}
	}
	return out
}

// UnknownPart is a part of an infra a service's last listing could not read (a launcher.Gap
// on the wire): the replicas there are kept as last seen, their instances unknown rather than
// gone.
type UnknownPart struct {
	Infra  string `json:"infra"`
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// Reason is why it could not be read.
	Reason string `json:"reason,omitempty"`
}

// UnknownParts converts a listing's gaps for the wire.
func UnknownParts(gaps []launcher.Gap) []UnknownPart {
	var out []UnknownPart
	for _, g := range gaps {
		p := UnknownPart{Infra: g.Infra, Region: g.Region, Zone: g.Zone}
		if g.Err != nil {
			p.Reason = g.Err.Error()
		}
		out = append(out, p)
	}
	return out
}

// Gap is the part as launcher.Gap, for its Covers and Where.
func (p UnknownPart) Gap() launcher.Gap {
	return launcher.Gap{Infra: p.Infra, Region: p.Region, Zone: p.Zone}
}

// DeleteServiceResult is what `serve down` answers. A teardown succeeds for everything that
// can be reached; LeftBehind says exactly what could not be (an infra that did not answer),
// which the controller stops when that infra answers again.
type DeleteServiceResult struct {
	// Status is "deleted", as the answer was before it said more.
	Status     string              `json:"status"`
	LeftBehind []launcher.Leftover `json:"left_behind,omitempty"`
}

func (s *server) infras(w http.ResponseWriter, _ *http.Request) {
	h := s.b.Infras()
	if h.States == nil {
		h.States = []launcher.InfraState{}
	}
	if h.Errors == nil {
		h.Errors = []InfraErrors{}
	}
	if h.Leftovers == nil {
		h.Leftovers = []launcher.Leftover{}
	}
	WriteJSON(w, http.StatusOK, h)
}

func (s *server) deleteService(w http.ResponseWriter, r *http.Request) {
	res, err := s.b.DeleteService(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, err)
		return
	}
	res.Status = "deleted"
	WriteJSON(w, http.StatusOK, res)
}

// Infras asks the controller for its view of the infras.
func (c *Client) Infras(ctx context.Context) (InfraHealth, error) {
	var h InfraHealth
	err := c.Do(ctx, http.MethodGet, "/v1/infras", nil, &h)
	return h, err
}

// DeleteService tears a service down and waits until its replicas are stopped or handed to
// the controller's janitor (LeftBehind). An answer without a body, or one without
// left_behind (a controller from before it said what was left), is nothing left.
func (c *Client) DeleteService(ctx context.Context, name string) (DeleteServiceResult, error) {
	path := "/v1/services/" + url.PathEscape(name)
	resp, err := c.Request(ctx, http.MethodDelete, path, nil)
	if err != nil {
		return DeleteServiceResult{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return DeleteServiceResult{}, fmt.Errorf("DELETE %s: read response: %w", path, err)
	}
	var res DeleteServiceResult
	if len(bytes.TrimSpace(raw)) == 0 {
		return res, nil
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return DeleteServiceResult{}, fmt.Errorf("DELETE %s: decode response: %w", path, err)
	}
	return res, nil
}
