package configs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Overrides are values given on the command line (`-n NAME`, `--env K=V`, `--secret K=V`).
// They are applied before validation, so a YAML that leaves a value null for the command line
// to fill (SkyPilot's convention for secrets) validates only once the value is supplied.
type Overrides struct {
	// Envs add to or replace the task's envs.
	Envs map[string]string
	// Secrets add to or replace the task's secrets, and fill secrets the YAML leaves null.
	Secrets map[string]string
	// Name, when not empty, replaces the task's name.
	Name string
}

// maxFileBytes caps a task file; real ones are a few KB, and this keeps a stray upload of a
// model file from being parsed as YAML.
const maxFileBytes = 4 << 20

// Load reads a task file and parses it. Unlike Parse, a secret the YAML leaves null and the
// overrides do not supply is taken from the process environment variable of the same name, as
// `sky serve up` does, so that `HF_TOKEN=... ferry serve up vllm.yaml` works.
func Load(path string, ov Overrides) (*Task, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("configs: read task file: %w", err)
	}
	return parse(path, data, ov, os.LookupEnv)
}

// Parse parses and validates a task. filename is used only in messages. It never reads the
// environment (except to expand ~ in tls paths), so it is safe for tests and for a server that
// receives YAML from a client. On failure the error is an errors.Join of *Error, one per
// problem found; use Errors to get them.
func Parse(filename string, data []byte, ov Overrides) (*Task, error) {
	return parse(filename, data, ov, nil)
}

func parse(filename string, data []byte, ov Overrides, lookupEnv func(string) (string, bool)) (task *Task, err error) {
	c := newTaskChecker(filename, lookupEnv)
	defer recoverParse(filename, &err)
	root := c.document(data)
	if root == nil {
		return nil, c.err()
	}
	return c.finishTask(c.task(root, ov, lookupEnv))
}

// newTaskChecker is the checker of a task file; with lookupEnv (Load), relative service.tls
// paths are resolved where the CLI runs (tls.go).
func newTaskChecker(filename string, lookupEnv func(string) (string, bool)) *checker {
	c := newChecker(filename)
	c.lookupEnv, c.taskFile = lookupEnv, true
	if lookupEnv != nil {
		c.cwd, _ = os.Getwd()
	}
	return c
}

// recoverParse turns a panic while parsing into a problem with the file: parsing must never
// take a caller down (a controller that received the YAML); a panic here is a bug.
func recoverParse(filename string, err *error) {
	if r := recover(); r != nil {
		*err = &Error{File: filename, Msg: fmt.Sprintf("internal error while validating (please report): %v", r)}
	}
}

// finishTask is t, read by c, with where it came from and c's notes; or c's problems.
func (c *checker) finishTask(t *Task) (*Task, error) {
	if err := c.err(); err != nil {
		return nil, err
	}
	t.Source = c.file
	t.Notes = c.sortedNotes()
	return t, nil
}

var yamlLineRE = regexp.MustCompile(`(?s)^yaml: line (\d+): (.*)$`)

// document decodes a file of one task and returns its top-level mapping, or nil after
// recording why there is none.
func (c *checker) document(data []byte) *yaml.Node { return c.soleTask(c.documents(data)) }

// soleTask is the top-level mapping of a file of one task, decoded as docs (nil: it could not
// be), or nil after recording why there is none.
func (c *checker) soleTask(docs []*yaml.Node) *yaml.Node {
	switch {
	case docs == nil:
		return nil
	case len(docs) > 1 && isJobGroup(docs[0]):
		c.errorf(docs[1], "", "a SkyPilot job group (several tasks launched together), which Ferry does not run: put each task in a file of its own and launch each (a service with ferry serve up, a job with ferry jobs launch)")
		return nil
	case len(docs) > 1:
		c.errorf(docs[1], "", "a second YAML document (after ---): a service file holds one task (several tasks are a pipeline, run in order as one managed job: ferry jobs launch FILE)")
		return nil
	case len(docs) == 0:
		c.errorf(&yaml.Node{Line: 1, Column: 1}, "", "empty document: a task needs at least `run`")
		return nil
	}
	return c.taskRoot(docs[0], "")
}

// documents decodes every YAML document of data (none for an empty file), or returns nil after
// recording why it cannot.
func (c *checker) documents(data []byte) (docs []*yaml.Node) {
	if len(data) > maxFileBytes {
		c.errorf(nil, "", "file is %d bytes; a task file may be at most %d", len(data), maxFileBytes)
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			docs = nil
			c.errorf(nil, "", "invalid YAML: the parser failed: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	docs = []*yaml.Node{}
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			c.syntaxError(err)
			return nil
		}
		docs = append(docs, &doc)
	}
}

// taskRoot is document doc's top-level mapping, or nil after recording why there is none;
// which names the task in a file of several ("task 2 of 3"), "" in a file of one.
func (c *checker) taskRoot(doc *yaml.Node, which string) *yaml.Node {
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = c.deref(doc.Content[0])
	}
	switch {
	case isNull(root) && which == "":
		c.errorf(&yaml.Node{Line: 1, Column: 1}, "", "empty document: a task needs at least `run`")
	case isNull(root):
		c.errorf(&yaml.Node{Line: doc.Line, Column: doc.Column}, "", "%s is an empty document: a task needs at least `run`", which)
	case root.Kind != yaml.MappingNode && which == "":
		c.errorf(root, "", "expected a mapping of task fields at the top level, got %s", describe(root))
	case root.Kind != yaml.MappingNode:
		c.errorf(root, "", "%s: expected a mapping of task fields, got %s", which, describe(root))
	default:
		return root
	}
	return nil
}

// isJobGroup says whether doc is a SkyPilot job group's header (execution or primary_tasks
// beside its name), which SkyPilot follows with one document per task.
func isJobGroup(doc *yaml.Node) bool {
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return false
	}
	m := doc.Content[0].Content
	for i := 0; i+1 < len(m); i += 2 {
		if m[i].Value == "execution" || m[i].Value == "primary_tasks" {
			return true
		}
	}
	return false
}

// syntaxError turns yaml.v3's "yaml: line N: msg" into a positioned Error.
func (c *checker) syntaxError(err error) {
	msg := err.Error()
	e := &Error{File: c.file}
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else if len(msg) > 6 && msg[:6] == "yaml: " {
		msg = msg[6:]
	}
	e.Msg = "invalid YAML: " + msg
	c.errs = append(c.errs, e)
}

var taskKeys = keysOf[Task]()

// nameRE is a DNS label: names become hostnames, Kubernetes object names and URL parts.
var nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)

// envNameRE is what a POSIX shell accepts as a variable name.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// nameProblem says what is wrong with a task name, or "" if nothing is.
func nameProblem(name string) string {
	if len(name) > 63 {
		return fmt.Sprintf("%s is %d characters; names are at most 63", quoteShort(name), len(name))
	}
	if !nameRE.MatchString(name) {
		hint := ""
		if s := dnsName(name); s != "" {
			// SkyPilot allows upper case, '_' and '.'; Ferry's names become hostnames and
			// Kubernetes object names.
			hint = fmt.Sprintf(" (e.g. name: %s)", s)
		}
		return fmt.Sprintf("%s is not a valid name: use lowercase letters, digits and '-', starting with a letter and not ending with '-'%s", quoteShort(name), hint)
	}
	return ""
}

// skypilotNameRE is the task names SkyPilot accepts (sky/task.py's _VALID_NAME_REGEX, with
// either case): letters and digits, joined by one or two of '.', '_' and '-'.
var skypilotNameRE = regexp.MustCompile(`(?i)^[a-z0-9]+([._-]{1,2}[a-z0-9]+)*$`)

// taskName reads the file's name. A name SkyPilot accepts but that is not a DNS label
// (minGPT-ddp, bert_qa) is used in its DNS-safe form, with a note: Ferry's names become
// hostnames and Kubernetes object names.
func (c *checker) taskName(at *yaml.Node, name string) string {
	msg := nameProblem(name)
	if msg == "" {
		return name
	}
	if safe := dnsName(name); safe != "" && len(name) <= 63 && skypilotNameRE.MatchString(name) {
		c.notef(at, "name", "%s is used as %s: Ferry's names become hostnames and Kubernetes object names (lowercase letters, digits and '-'); -n NAME gives another", quoteShort(name), quoteShort(safe))
		return safe
	}
	c.errorf(at, "name", "%s", msg)
	return name
}

// dnsName is name made valid (lower case, other characters as '-'), or "" if nothing is left.
func dnsName(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := strings.TrimLeft(strings.TrimRight(b.String(), "-"), "0123456789-")
	if len(s) > 63 {
		s = strings.TrimRight(s[:63], "-")
	}
	if !nameRE.MatchString(s) {
		return ""
	}
	return s
}

func (c *checker) task(root *yaml.Node, ov Overrides, lookupEnv func(string) (string, bool)) *Task {
	f, _ := c.fields(root, "", taskKeys)
	t := &Task{NumNodes: 1}

	if e, ok := f["name"]; ok {
		// -n replaces the file's name whatever it is, so only the type is checked then.
		if s, ok := c.str(e.value, "name"); ok && ov.Name == "" {
			t.Name = c.taskName(e.value, s)
		}
	}
	if ov.Name != "" {
		t.Name = ov.Name
		if msg := nameProblem(ov.Name); msg != "" {
			c.errorf(nil, "name", "%s (given on the command line)", msg)
		}
	}
	numNodes, hasNumNodes := f["num_nodes"]
	if hasNumNodes {
		if n, ok := c.intAtLeast(numNodes.value, "num_nodes", 1); ok {
			t.NumNodes = n
		}
	}

	svcEntry, hasService := f["service"]
	var resNode *yaml.Node
	if e, ok := f["resources"]; ok {
		resNode = e.value
	}
	res, recovery := c.resources(resNode, hasService)
	t.Resources = res.withNodes(t.NumNodes)

	t.Envs = c.envs(f, "envs", ov.Envs, nil)
	t.Secrets = c.envs(f, "secrets", ov.Secrets, lookupEnv)
	c.checkOverlap(f, t.Envs, t.Secrets)
	vars := substitutionVars(t.Envs, t.Secrets)

	if e, ok := f["workdir"]; ok {
		c.workdir(t, c.substituted(e.value, vars)) // workdir.go: a directory or a git repository
	}
	if e, ok := f["config"]; ok {
		t.Config = c.taskConfig(e.value) // taskconfig.go
	}
	if e, ok := f["file_mounts"]; ok {
		c.fileMounts(t, c.substituted(e.value, vars)) // filemounts.go
	}
	if e, ok := f["setup"]; ok {
		t.Setup, _ = c.str(e.value, "setup")
	}
	if e, ok := f["run"]; ok {
		if s, ok := c.str(e.value, "run"); ok {
			if isBlank(s) {
				c.errorf(e.value, "run", "required: the command the task runs (a service's starts its server) (got an empty string)")
			}
			t.Run = s
		}
	} else {
		c.errorf(root, "run", "required: the command the task runs (a service's starts its server)")
	}

	jobEntry, hasJob := f["job"]
	if hasService {
		svcEntry.value = c.substituted(svcEntry.value, vars)
		t.Service = c.service(svcEntry, res, t.Envs, t.Secrets)
		c.replicaNodes(t, f) // service.go
		if hasJob {
			c.errorf(jobEntry.keyNode, "job", "a service has no job section: priorities and recovery are for tasks without service:")
		}
	} else {
		var je *entry
		if hasJob {
			je = &jobEntry
		}
		job := c.job(je, recovery)
		c.checkElastic(&job, t.NumNodes, recovery, numNodes.value) // elastic.go
		t.Job = &job
	}
	c.checkInfraLimits(t, f)
	return t
}

func isBlank(s string) bool {
	for _, r := range s {
		if r != ' ' && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}

// envs reads `envs` or `secrets`: names to scalar values. A null value must be filled by the
// overrides (or, for secrets under Load, the process environment); overrides also add names.
func (c *checker) envs(f map[string]entry, field string, overrides map[string]string, lookupEnv func(string) (string, bool)) map[string]string {
	out := map[string]string{}
	flag := "--env"
	if field == "secrets" {
		flag = "--secret"
	}
	var ps []entry
	if e, ok := f[field]; ok {
		ps, _ = c.pairs(e.value, field)
	}
	for _, p := range ps {
		name := joinField(field, p.key)
		if !envNameRE.MatchString(p.key) {
			c.errorf(p.keyNode, name, "%s is not a valid environment variable name (letters, digits and _, not starting with a digit)", quoteShort(p.key))
			continue
		}
		if _, ok := overrides[p.key]; ok {
			continue // the override below wins; its value need not be valid here
		}
		if isNull(p.value) {
			if v, ok := lookup(lookupEnv, p.key); ok {
				out[p.key] = v
				continue
			}
			hint := ""
			if field == "secrets" {
				hint = fmt.Sprintf(" or set %s in the environment", p.key)
			}
			c.errorf(p.value, name, "no value: give one here, or pass %s %s=VALUE%s", flag, p.key, hint)
			continue
		}
		if v, ok := c.scalarText(p.value, name); ok {
			out[p.key] = v
		}
	}
	for _, k := range slices.Sorted(maps.Keys(overrides)) {
		if !envNameRE.MatchString(k) {
			c.errorf(nil, joinField(field, k), "%s is not a valid environment variable name (given with %s)", quoteShort(k), flag)
			continue
		}
		out[k] = overrides[k]
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func lookup(lookupEnv func(string) (string, bool), name string) (string, bool) {
	if lookupEnv == nil {
		return "", false
	}
	return lookupEnv(name)
}

// checkOverlap rejects a name that is both an env and a secret: which value the replica sees
// would be ambiguous, and the env copy would be shown where the secret is hidden.
func (c *checker) checkOverlap(f map[string]entry, envs, secrets map[string]string) {
	var secretKeys map[string]*yaml.Node
	if e, ok := f["secrets"]; ok && e.value.Kind == yaml.MappingNode {
		secretKeys = map[string]*yaml.Node{}
		for i := 0; i+1 < len(e.value.Content); i += 2 {
			secretKeys[e.value.Content[i].Value] = e.value.Content[i]
		}
	}
	for _, k := range slices.Sorted(maps.Keys(secrets)) {
		if _, ok := envs[k]; ok {
			c.errorf(secretKeys[k], joinField("secrets", k), "also set in envs: a name is either an env or a secret")
		}
	}
}
