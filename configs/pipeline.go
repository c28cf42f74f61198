package configs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
	docs, err := documents(filename, data)
	if err != nil {
		return nil, err
	}
	if len(docs) <= 1 || isJobGroup(docs[0]) {
		t, err := parse(filename, data, ov, lookupEnv) // its errors, as for any task file
		if err != nil {
			return nil, err
		}
		return &Pipeline{Name: t.Name, Tasks: []*Task{t}}, nil
	}
	defer func() {
		if r := recover(); r != nil {
			p, err = nil, &Error{File: filename, Msg: fmt.Sprintf("internal error while validating (please report): %v", r)}
		}
	}()
	p = &Pipeline{Name: ov.Name}
	if name, ok := headerName(docs[0]); ok {
		if p.Name == "" {
			p.Name = name
		}
		docs = docs[1:]
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

// documents decodes every YAML document of data, up to the first syntax error.
func documents(filename string, data []byte) ([]*yaml.Node, error) {
	if len(data) > maxFileBytes {
		return nil, &Error{File: filename, Msg: fmt.Sprintf("file is %d bytes; a task file may be at most %d", len(data), maxFileBytes)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			c := newChecker(filename)
			c.syntaxError(err)
			return nil, c.err()
		}
		docs = append(docs, &doc)
	}
}

// headerName is the name of a header document, one whose mapping holds only name.
func headerName(doc *yaml.Node) (string, bool) {
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return "", false
	}
	m := doc.Content[0].Content
	if len(m) != 2 || m[0].Value != "name" || m[1].Kind != yaml.ScalarNode {
		return "", false
	}
	return m[1].Value, true
}

// pipelineTask checks document doc as task i of n.
func pipelineTask(filename string, doc *yaml.Node, ov Overrides, lookupEnv func(string) (string, bool), i, n int) (*Task, error) {
	c := newChecker(filename)
	c.lookupEnv, c.taskFile = lookupEnv, true
	if lookupEnv != nil {
		c.cwd, _ = os.Getwd()
	}
	at := &yaml.Node{Line: doc.Line, Column: doc.Column}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = c.deref(doc.Content[0])
		at = root
	}
	switch {
	case isNull(root):
		c.errorf(at, "", "task %d of %d is an empty document: a task needs at least `run`", i+1, n)
		return nil, c.err()
	case root.Kind != yaml.MappingNode:
		c.errorf(root, "", "task %d of %d: expected a mapping of task fields, got %s", i+1, n, describe(root))
		return nil, c.err()
	}
	t := c.task(root, ov, lookupEnv)
	if t.Service != nil {
		c.errorf(root, "service", "task %d of %d has a service section: a pipeline's tasks are jobs, run one after the other (serve a service with ferry serve up)", i+1, n)
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	t.Source = filename
	t.Notes = c.sortedNotes()
	return t, nil
}
