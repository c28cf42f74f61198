package kubestore

import (
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/jobs"
)

const (
	stateObject  = "ferry-state"
	keyNextJobID = "next-job-id"
	keyJob       = "job.json"
	keyJobTask   = "task.json"
)

func jobObject(id int64) string { return "ferry-job-" + strconv.FormatInt(id, 10) }

// nextJobID takes the next id from ferry-state's counter, creating it at 1: like SQLite's
// AUTOINCREMENT, an id is never handed out twice.
func (s *Store) nextJobID() (int64, error) {
	objs := s.configMaps()
	for range 2 {
		var id int64
		_, err := objs.Update(stateObject, func(cm *corev1.ConfigMap) error {
			n, err := strconv.ParseInt(cm.Data[keyNextJobID], 10, 64)
			if err != nil {
				return fmt.Errorf("kubestore: %s %s: %w", stateObject, keyNextJobID, err)
			}
			id = n
			cm.Data[keyNextJobID] = strconv.FormatInt(n+1, 10)
			return nil
		})
		if !apierrors.IsNotFound(err) {
			return id, err
		}
		cm := &corev1.ConfigMap{ObjectMeta: objectMeta(stateObject, "state", ""), Data: map[string]string{keyNextJobID: "1"}}
		if _, err := objs.Create(cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("kubestore: %s: created and gone again", stateObject)
}

// CreateJob implements jobs.Store. The full task is sealed before the job's ConfigMap names the
// job.
func (s *Store) CreateJob(j jobs.Job) (int64, error) {
	id, err := s.nextJobID()
	if err != nil {
		return 0, fmt.Errorf("create job: %w", err)
	}
	j.ID = id
	name := jobObject(id)
	if err := s.putSecret(name, "", true, map[string]any{keyJobTask: j.Task}); err != nil {
		return 0, fmt.Errorf("create job: %w", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(name, "job", "")}
	j.Task = j.Task.Redacted()
	if err := putJSON(cm, keyJob, j); err != nil {
		return 0, err
	}
	if _, err := s.configMaps().Create(cm); err != nil {
		return 0, fmt.Errorf("create job: %w", err)
	}
	return id, nil
}

// SaveJob implements jobs.Store.
func (s *Store) SaveJob(j jobs.Job) error {
	name := jobObject(j.ID)
	ctx, cancel := s.ctx()
	defer cancel()
	if _, err := s.configMaps().read(ctx, name, false); err != nil {
		return wrapNotFound(err, fmt.Sprintf("save job %d", j.ID))
	}
	var stored configs.Task
	if err := s.secretJSON(name, keyJobTask, &stored); err != nil || !sameTask(&stored, j.Task) {
		if err := s.putSecret(name, "", false, map[string]any{keyJobTask: j.Task}); err != nil {
			return fmt.Errorf("save job %d: %w", j.ID, err)
		}
	}
	j.Task = j.Task.Redacted()
	_, err := s.configMaps().Update(name, func(cm *corev1.ConfigMap) error { return putJSON(cm, keyJob, j) })
	if err != nil {
		return fmt.Errorf("save job %d: %w", j.ID, wrapNotFound(err, "job"))
	}
	return nil
}

func sameTask(a, b *configs.Task) bool {
	x, err1 := jsonString(a)
	y, err2 := jsonString(b)
	return err1 == nil && err2 == nil && x == y
}

// ListJobs implements jobs.Store, oldest first.
func (s *Store) ListJobs() ([]jobs.Job, error) {
	cms, err := s.cms.List(kindSelector("job", ""))
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	out := make([]jobs.Job, 0, len(cms))
	for _, cm := range cms {
		var j jobs.Job
		if _, err := getJSON(cm, keyJob, &j); err != nil {
			return nil, err
		}
		j.Task = nil
		if err := s.secretJSON(cm.Name, keyJobTask, &j.Task); err != nil {
			return nil, fmt.Errorf("job %d: %w", j.ID, err)
		}
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b jobs.Job) int { return int(a.ID - b.ID) })
	return out, nil
}

var _ store.Store = (*Store)(nil)
