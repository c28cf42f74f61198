package configs

import (
	"net/url"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// SkyPilot's workdir is a local directory or, as a mapping, a git repository:
//
//	workdir:
//	  url: https://github.com/skypilot-org/skypilot.git
//	  ref: v0.10.0            # a branch, a tag or a commit; none is the default branch
//
// The repository is cloned at ref on each node, into ~/sky_workdir, where setup and run start
// (nodefiles.GitCloneShell). A private repository over HTTPS takes its token from the task's
// GIT_TOKEN (a secret: `secrets: {GIT_TOKEN: null}`), as SkyPilot's does.

// GitWorkdir is the mapping form of `workdir`.
type GitWorkdir struct {
	URL string `json:"url" yaml:"url"`
	// Ref is a branch, a tag or a commit; "" is the repository's default branch.
	Ref string `json:"ref,omitempty" yaml:"ref,omitempty"`
}

// String is "URL@REF", or the URL alone.
func (g GitWorkdir) String() string {
	if g.Ref == "" {
		return g.URL
	}
	return g.URL + "@" + g.Ref
}

var gitWorkdirKeys = keysOf[GitWorkdir]()

// scpLikeRE is git's scp-like syntax, user@host:path.
var scpLikeRE = regexp.MustCompile(`^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+$`)

// gitRefRE is what git takes as a branch, tag or commit (git check-ref-format, loosely); it never
// starts with '-', so it cannot be read as an option.
var gitRefRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/+-]*$`)

// workdir reads `workdir`: a local directory (a string), or a git repository (a mapping).
func (c *checker) workdir(t *Task, n *yaml.Node) {
	const field = "workdir"
	n = c.deref(n)
	if n.Kind != yaml.MappingNode {
		t.Workdir, _ = c.str(n, field)
		return
	}
	f, _ := c.fields(n, field, gitWorkdirKeys)
	g := &GitWorkdir{}
	e, ok := f["url"]
	if !ok {
		c.errorf(n, joinField(field, "url"), "required: the git repository to clone (https://, ssh://, git@HOST:PATH or file://)")
		return
	}
	u, good := c.str(e.value, joinField(field, "url"))
	if !good {
		return
	}
	if problem := gitURLProblem(u); problem != "" {
		c.errorf(e.value, joinField(field, "url"), "%s", problem)
		good = false
	}
	g.URL = u
	if r, ok := f["ref"]; ok {
		ref, isStr := c.str(r.value, joinField(field, "ref"))
		switch {
		case !isStr:
			good = false
		case !gitRefRE.MatchString(ref) || strings.Contains(ref, "..") || len(ref) > 255:
			c.errorf(r.value, joinField(field, "ref"), "%s is not a branch, tag or commit name", quoteShort(ref))
			good = false
		default:
			g.Ref = ref
		}
	}
	if good {
		t.GitWorkdir = g
	}
}

// gitURLProblem says why u is not a repository URL a node can clone, or "".
func gitURLProblem(u string) string {
	const shapes = "https://HOST/PATH, ssh://HOST/PATH, git@HOST:PATH or file:///PATH"
	if strings.TrimSpace(u) != u || u == "" || strings.HasPrefix(u, "-") || strings.ContainsAny(u, " \t\n\r") {
		return quoteShort(u) + " is not a git repository URL: use " + shapes
	}
	if scpLikeRE.MatchString(u) {
		return ""
	}
	p, err := url.Parse(u)
	if err != nil || p.Host == "" && p.Scheme != "file" {
		return quoteShort(u) + " is not a git repository URL: use " + shapes
	}
	switch p.Scheme {
	case "https", "http", "ssh", "git", "file":
	default:
		return quoteShort(u) + ": git clones over https, http, ssh, git and file URLs, not " + p.Scheme
	}
	if _, hasPassword := p.User.Password(); p.User != nil && (p.Scheme != "ssh" || hasPassword) {
		// A token in the URL would be shown with the task and kept in the clone's .git/config.
		return "the URL carries credentials, which would be shown with the task: write the URL without them and give the token as a secret (secrets: {GIT_TOKEN: null}, then --secret GIT_TOKEN)"
	}
	return ""
}

// resolvedNode is the repository's mapping as ResolvedYAML writes it, by yaml.v3's own rules
// (which quote a ref such as "no" that YAML 1.1 readers would take for a boolean).
func (g *GitWorkdir) resolvedNode() *yaml.Node {
	n, _ := yamlOf(g) // two strings always encode
	return n
}
