package configs

import (
	"errors"
	"fmt"
	"os"

	"gopkg.in/yaml.v3"
)

// Pipeline is a managed job of ordered tasks, written as SkyPilot writes one: task documents
// separated by `---`, optionally after a header document holding only the pipeline's name
// (sky/utils/dag_utils.py load_chain_dag_from_yaml). Each task runs once the one before it has
// succeeded; a failed task fails the job. Every task is a job's task: no service section.
type Pipeline struct {
	// Name is the header's name, else the first task's; -n replaces it.
	Name  string  `json:"name,omitempty"`
	Tasks []*Task `json:"tasks"`
}

// LoadPipeline reads a task file of one task or several. One task gives a Pipeline of one,
// exactly as Load parses it; with several, the overrides' envs and secrets apply to every task
// and its name to the pipeline.
func LoadPipeline(path string, ov Overrides) (*Pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("configs: read task file: %w", err)
	}
	return parsePipeline(path, data, ov, os.LookupEnv)
}

// ParsePipeline is LoadPipeline for a file already read, without the environment (Parse).
func ParsePipeline(filename string, data []byte, ov Overrides) (*Pipeline, error) {
	return parsePipeline(filename, data, ov, nil)
}

func parsePipeline(filename string, data []byte, ov Overrides, lookupEnv func(string) (string, bool)) (p *Pipeline, err error) {
	c := newTaskChecker(filename, lookupEnv)
	defer recoverParse(filename, &err)
	docs := c.documents(data)
	if len(docs) <= 1 || isJobGroup(docs[0]) {
		root := c.soleTask(docs) // a file of one task, with its errors
		if root == nil {
			return nil, c.err()
		}
		t, err := c.finishTask(c.task(root, ov, lookupEnv))
		if err != nil {
			return nil, err
		}
		return &Pipeline{Name: t.Name, Tasks: []*Task{t}}, nil
	}
	p = &Pipeline{}
	if headerName(docs[0]) {
		name := docs[0].Content[0].Content[1]
		p.Name = c.taskName(name, name.Value)
		docs = docs[1:]
	}
	if ov.Name != "" {
		p.Name = ov.Name
		if msg := nameProblem(ov.Name); msg != "" {
			c.errorf(nil, "name", "%s (given on the command line)", msg)
		}
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	perTask := Overrides{Envs: ov.Envs, Secrets: ov.Secrets}
	var errs []error
	for i, doc := range docs {
		t, err := pipelineTask(filename, doc, perTask, lookupEnv, i, len(docs))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.Tasks = append(p.Tasks, t)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if p.Name == "" {
		p.Name = p.Tasks[0].Name
	}
	return p, nil
}

// headerName reports whether doc is a pipeline's header: a mapping holding only a scalar name.
func headerName(doc *yaml.Node) bool {
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return false
	}
	m := doc.Content[0].Content
	return len(m) == 2 && m[0].Value == "name" && m[1].Kind == yaml.ScalarNode
}

// pipelineTask checks document doc as task i of n.
func pipelineTask(filename string, doc *yaml.Node, ov Overrides, lookupEnv func(string) (string, bool), i, n int) (*Task, error) {
	c := newTaskChecker(filename, lookupEnv)
	root := c.taskRoot(doc, fmt.Sprintf("task %d of %d", i+1, n))
	if root == nil {
		return nil, c.err()
	}
	t := c.task(root, ov, lookupEnv)
	if t.Service != nil {
		c.errorf(root, "service", "task %d of %d has a service section: a pipeline's tasks are jobs, run one after the other (serve a service with ferry serve up)", i+1, n)
	}
	return c.finishTask(t)
}
