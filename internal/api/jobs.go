package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/jobs"
)

// Jobs is what the jobs routes need: the controller's jobs.Manager.
type Jobs interface {
	Submit(task *configs.Task) (jobs.Job, error)
	SubmitPipeline(p *configs.Pipeline) (jobs.Job, error)
	Find(ref string) (jobs.Job, error)
	List() []jobs.Job
	Cancel(id int64) (jobs.Job, error)
	Logs(ctx context.Context, ref string, rank int, follow bool, w io.Writer) error
}

// LaunchJobRequest submits a task without a service section as a job, or a pipeline of
// such tasks as one job that runs them in order.
type LaunchJobRequest struct {
	Task     *configs.Task     `json:"task,omitempty"`
	Pipeline *configs.Pipeline `json:"pipeline,omitempty"`
}

// JobStatus is one job as `jobs queue` shows it: the job with its task redacted, and its
// times so far.
type JobStatus struct {
	jobs.Job
	NumNodes          int     `json:"num_nodes"`
	Resources         string  `json:"resources"`
	Where             string  `json:"where,omitempty"`
	PricePerHour      float64 `json:"price_per_hour"`
	QueuedSeconds     float64 `json:"queued_seconds"`
	RunningSeconds    float64 `json:"running_seconds"`
	RecoveringSeconds float64 `json:"recovering_seconds"`
}

// StatusOf is j as the API shows it at now.
func StatusOf(j jobs.Job, now time.Time) JobStatus {
	q, r, rec := j.Elapsed(now)
	st := JobStatus{Job: j, QueuedSeconds: q.Seconds(), RunningSeconds: r.Seconds(), RecoveringSeconds: rec.Seconds(),
		Where: j.Where(), PricePerHour: j.PricePerHour()}
	if j.Task != nil {
		st.Task = j.Task.Redacted()
		st.NumNodes = j.Task.NumNodes
		st.Resources = j.Task.Resources.String()
	}
	st.Pipeline = nil
	for _, t := range j.Pipeline {
		st.Pipeline = append(st.Pipeline, t.Redacted())
	}
	return st
}

// Holding is one instance someone holds, for `ferry capacity`: a service's replica or a
// job's node, where it runs and what it costs.
type Holding struct {
	// Kind is "service" or "job"; Owner the service's name or the job's "name (id)"; Unit
	// "replica 3" or "node 0".
	Kind         string    `json:"kind"`
	Owner        string    `json:"owner"`
	Unit         string    `json:"unit"`
	State        string    `json:"state"`
	Infra        string    `json:"infra"`
	Zone         string    `json:"zone,omitempty"`
	Spot         bool      `json:"spot,omitempty"`
	Resources    string    `json:"resources,omitempty"`
	PricePerHour float64   `json:"price_per_hour"`
	Since        time.Time `json:"since,omitzero"`
	// Priority and Preemptible are a job's (services stand at configs.ServingPriority).
	Priority    int  `json:"priority,omitempty"`
	Preemptible bool `json:"preemptible,omitempty"`
}

// Capacity lists who holds what.
func (c *Client) Capacity(ctx context.Context) ([]Holding, error) {
	var out []Holding
	err := c.Do(ctx, http.MethodGet, "/v1/capacity", nil, &out)
	return out, err
}

// JobRoutes are the jobs API: submit, list, show, cancel, logs.
func JobRoutes(j Jobs, log *zap.Logger) []Route {
	h := jobHandlers{j: j, log: log}
	return []Route{
		{Method: http.MethodPost, Pattern: "/v1/jobs", Handler: h.launch},
		{Method: http.MethodGet, Pattern: "/v1/jobs", Handler: h.list},
		{Method: http.MethodGet, Pattern: "/v1/jobs/{ref}", Handler: h.get},
		{Method: http.MethodPost, Pattern: "/v1/jobs/{ref}/cancel", Handler: h.cancel},
		{Method: http.MethodGet, Pattern: "/v1/jobs/{ref}/logs", Handler: h.logs},
	}
}

type jobHandlers struct {
	j   Jobs
	log *zap.Logger
}

// jobError maps the jobs package's errors to the API's kinds.
func jobError(err error) error {
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return fmt.Errorf("%w: %s", ErrNotFound, err.Error())
	case errors.Is(err, jobs.ErrEnded):
		return fmt.Errorf("%w: %s", ErrConflict, err.Error())
	case errors.Is(err, jobs.ErrInvalid):
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return err
}

func (h jobHandlers) launch(w http.ResponseWriter, r *http.Request) {
	var req LaunchJobRequest
	if err := DecodeBody(w, r, maxTaskBytes, &req); err != nil {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
		return
	}
	p := req.Pipeline
	if p == nil && req.Task != nil {
		p = &configs.Pipeline{Name: req.Task.Name, Tasks: []*configs.Task{req.Task}}
	}
	if p == nil || len(p.Tasks) == 0 {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "missing task")
		return
	}
	for i, t := range p.Tasks {
		problem := "a pipeline's task is null"
		if t != nil {
			problem = checkJobTask(t)
		}
		if problem != "" && len(p.Tasks) > 1 {
			problem = fmt.Sprintf("task %d of %d: %s", i+1, len(p.Tasks), problem)
		}
		if problem != "" {
			rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", problem)
			return
		}
	}
	j, err := h.j.SubmitPipeline(p)
	if err != nil {
		WriteError(w, h.log, jobError(err))
		return
	}
	WriteJSON(w, http.StatusCreated, StatusOf(j, time.Now()))
}

func (h jobHandlers) list(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	out := []JobStatus{}
	for _, j := range h.j.List() {
		out = append(out, StatusOf(j, now))
	}
	WriteJSON(w, http.StatusOK, out)
}

func (h jobHandlers) get(w http.ResponseWriter, r *http.Request) {
	j, err := h.j.Find(r.PathValue("ref"))
	if err != nil {
		WriteError(w, h.log, jobError(err))
		return
	}
	WriteJSON(w, http.StatusOK, StatusOf(j, time.Now()))
}

func (h jobHandlers) cancel(w http.ResponseWriter, r *http.Request) {
	j, err := h.j.Find(r.PathValue("ref"))
	if err == nil {
		j, err = h.j.Cancel(j.ID)
	}
	if err != nil {
		WriteError(w, h.log, jobError(err))
		return
	}
	WriteJSON(w, http.StatusAccepted, StatusOf(j, time.Now()))
}

func (h jobHandlers) logs(w http.ResponseWriter, r *http.Request) {
	rank := 0
	if v := r.URL.Query().Get("node"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "node must be a rank, 0 or more")
			return
		}
		rank = n
	}
	ref := r.PathValue("ref")
	j, err := h.j.Find(ref)
	if err != nil {
		WriteError(w, h.log, jobError(err))
		return
	}
	if j.Task != nil && rank >= max(j.Task.NumNodes, 1) {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("job %d has nodes 0–%d", j.ID, max(j.Task.NumNodes, 1)-1))
		return
	}
	follow := r.URL.Query().Get("follow") == "1"
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fw := flushWriter{w: w}
	if f, ok := w.(http.Flusher); ok {
		fw.f = f
	}
	if err := h.j.Logs(r.Context(), strconv.FormatInt(j.ID, 10), rank, follow, fw); err != nil && r.Context().Err() == nil {
		fmt.Fprintf(fw, "ferry: %v\n", err)
	}
}

// checkJobTask refuses what the CLI's parse would have: the API is reachable without it.
func checkJobTask(t *configs.Task) string {
	switch {
	case t.Service != nil:
		return "the task has a service: section; start it with serve up"
	case t.NumNodes < 1:
		return fmt.Sprintf("num_nodes must be at least 1, got %d", t.NumNodes)
	case t.Run == "":
		return "the task has no run command"
	case t.Job == nil:
		return "the task has no job section (a CLI older than jobs?); parse it with this ferry"
	}
	return ""
}

// flushWriter flushes after each write, so that followed logs arrive as they are written.
type flushWriter struct {
	w io.Writer
	f http.Flusher
}

func (fw flushWriter) Write(p []byte) (int, error) {
	n, err := fw.w.Write(p)
	if fw.f != nil {
		fw.f.Flush()
	}
	return n, err
}

// LaunchJob submits task as a job.
func (c *Client) LaunchJob(ctx context.Context, task *configs.Task) (JobStatus, error) {
	var out JobStatus
	err := c.Do(ctx, http.MethodPost, "/v1/jobs", LaunchJobRequest{Task: task}, &out)
	return out, err
}

// LaunchPipeline queues a pipeline's tasks as one job that runs them in order.
func (c *Client) LaunchPipeline(ctx context.Context, p *configs.Pipeline) (JobStatus, error) {
	if len(p.Tasks) == 1 {
		return c.LaunchJob(ctx, p.Tasks[0]) // as an older controller takes it
	}
	var out JobStatus
	err := c.Do(ctx, http.MethodPost, "/v1/jobs", LaunchJobRequest{Pipeline: p}, &out)
	return out, err
}

// Jobs lists every job, newest first.
func (c *Client) Jobs(ctx context.Context) ([]JobStatus, error) {
	var out []JobStatus
	err := c.Do(ctx, http.MethodGet, "/v1/jobs", nil, &out)
	return out, err
}

// Job returns one job by id or name.
func (c *Client) Job(ctx context.Context, ref string) (JobStatus, error) {
	var out JobStatus
	err := c.Do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(ref), nil, &out)
	return out, err
}

// CancelJob cancels one job by id or name.
func (c *Client) CancelJob(ctx context.Context, ref string) (JobStatus, error) {
	var out JobStatus
	err := c.Do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(ref)+"/cancel", nil, &out)
	return out, err
}

// JobLogs copies node rank's output of a job to w; with follow, until the job ends.
func (c *Client) JobLogs(ctx context.Context, ref string, rank int, follow bool, w io.Writer) error {
	q := url.Values{"node": {strconv.Itoa(rank)}}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.Request(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(ref)+"/logs?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
