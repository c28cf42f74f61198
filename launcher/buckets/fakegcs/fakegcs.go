// Package fakegcs is an in-process stand-in for the Google Cloud Storage JSON API on loopback,
// for the subset Ferry's file_mounts use: objects.list (prefix, pageToken, maxResults),
// objects.get (metadata, and the object's bytes with alt=media), and for mounted buckets
// objects.insert (uploadType=media, and multipart as the Go client sends it) and
// objects.delete, with the API's JSON error envelope (404 for a missing bucket or object).
// Objects carry md5Hash (base64, as GCS gives it).
//
// Credentials: with Options.Token set, every request must carry "Authorization: Bearer
// TOKEN" (401 without, 403 with another); this is how a test tells that a VM used the token
// its metadata server gave. The server is also Google's Security Token Service for narrowed
// tokens (POST /v1/token, a token exchange with a Credential Access Boundary, as
// golang.org/x/oauth2/google/downscope sends it; the subject must be Options.Token): a
// narrowed token reads (GET) only objects its boundary's rules allow (a bucket, and the
// prefix of a resource.name.startsWith condition), and writes nothing. Media downloads are counted (Downloads), and every write is recorded
// with the token it carried (Writes).
package fakegcs

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Options configures a Server.
type Options struct {
	// Token, when set, is the only bearer token accepted.
	Token string
}

// Server is a fake GCS.
type Server struct {
	opts Options
	srv  *httptest.Server

	mu        sync.Mutex
	buckets   map[string]map[string][]byte
	downloads int
	readers   []string // the bearer token of each media download
	writes    []Write
	// narrowed are the tokens the token exchange issued: token -> readable "bucket/prefix"s.
	narrowed map[string][]string
}

// Write is one insert or delete served.
type Write struct {
	Method, Bucket, Name string
	// Token is the bearer token the request carried.
	Token string
}

// New starts a server on loopback; Close stops it.
func New(opts Options) *Server {
	s := &Server{opts: opts, buckets: map[string]map[string][]byte{}, narrowed: map[string][]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /storage/v1/b/{bucket}/o", s.list)
	mux.HandleFunc("GET /storage/v1/b/{bucket}/o/{object...}", s.get)
	mux.HandleFunc("DELETE /storage/v1/b/{bucket}/o/{object...}", s.delete)
	mux.HandleFunc("POST /upload/storage/v1/b/{bucket}/o", s.insert)
	root := http.NewServeMux()
	root.HandleFunc("POST /v1/token", s.exchange)
	root.Handle("/", s.auth(mux))
	s.srv = httptest.NewServer(root)
	return s
}

// URL is the API's root, "http://127.0.0.1:PORT".
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Put stores an object, making its bucket.
func (s *Server) Put(bucket, name string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buckets[bucket] == nil {
		s.buckets[bucket] = map[string][]byte{}
	}
	s.buckets[bucket][name] = body
}

// MakeBucket makes an empty bucket.
func (s *Server) MakeBucket(bucket string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buckets[bucket] == nil {
		s.buckets[bucket] = map[string][]byte{}
	}
}

// Get is an object's body.
func (s *Server) Get(bucket, name string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, ok := s.buckets[bucket][name]
	return body, ok
}

// Writes are the writes served, in order.
func (s *Server) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes)
}

// Readers are the bearer tokens of the media downloads served, in order.
func (s *Server) Readers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.readers)
}

// Downloads is how many alt=media GETs were served.
func (s *Server) Downloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downloads
}

func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opts.Token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			switch {
			case !ok:
				writeError(w, http.StatusUnauthorized, "Anonymous caller does not have storage.objects.get access.")
				return
			case got != s.opts.Token && !s.narrowedMay(got, r):
				writeError(w, http.StatusForbidden, "The caller does not have permission")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// narrowedMay says whether narrowed token tok may make request r: a GET of an object its
// boundary covers.
func (s *Server) narrowedMay(tok string, r *http.Request) bool {
	s.mu.Lock()
	allowed := s.narrowed[tok]
	s.mu.Unlock()
	rest, ok := strings.CutPrefix(r.URL.Path, "/storage/v1/b/")
	if !ok || r.Method != http.MethodGet {
		return false
	}
	bucket, object, _ := strings.Cut(rest, "/o/")
	for _, a := range allowed {
		b, prefix, _ := strings.Cut(a, "/")
		if b == bucket && object != "" && strings.HasPrefix(object, prefix) {
			return true
		}
	}
	return false
}

// exchange is the Security Token Service's token exchange for a Credential Access Boundary.
func (s *Server) exchange(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange" {
		writeError(w, http.StatusBadRequest, "not a token exchange")
		return
	}
	if s.opts.Token != "" && r.PostForm.Get("subject_token") != s.opts.Token {
		writeError(w, http.StatusUnauthorized, "invalid subject token")
		return
	}
	var opts struct {
		AccessBoundary struct {
			AccessBoundaryRules []struct {
				AvailableResource     string   `json:"availableResource"`
				AvailablePermissions  []string `json:"availablePermissions"`
				AvailabilityCondition *struct {
					Expression string `json:"expression"`
				} `json:"availabilityCondition"`
			} `json:"accessBoundaryRules"`
		} `json:"accessBoundary"`
	}
	if err := json.Unmarshal([]byte(r.PostForm.Get("options")), &opts); err != nil {
		writeError(w, http.StatusBadRequest, "options: "+err.Error())
		return
	}
	var allowed []string
	for _, rule := range opts.AccessBoundary.AccessBoundaryRules {
		bucket, ok := strings.CutPrefix(rule.AvailableResource, "//storage.googleapis.com/projects/_/buckets/")
		if !ok || !slices.Equal(rule.AvailablePermissions, []string{"inRole:roles/storage.objectViewer"}) {
			writeError(w, http.StatusBadRequest, "the fake narrows to storage.objectViewer on buckets only")
			return
		}
		prefix := ""
		if c := rule.AvailabilityCondition; c != nil {
			p, ok := strings.CutPrefix(c.Expression, "resource.name.startsWith('projects/_/buckets/"+bucket+"/objects/")
			if !ok || !strings.HasSuffix(p, "')") {
				writeError(w, http.StatusBadRequest, "the fake knows only resource.name.startsWith conditions")
				return
			}
			prefix = strings.TrimSuffix(p, "')")
		}
		allowed = append(allowed, bucket+"/"+prefix)
	}
	s.mu.Lock()
	tok := fmt.Sprintf("narrowed-%d", len(s.narrowed)+1)
	s.narrowed[tok] = allowed
	s.mu.Unlock()
	writeJSON(w, map[string]any{"access_token": tok, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token", "token_type": "Bearer", "expires_in": 3600})
}

type object struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Bucket  string `json:"bucket"`
	Size    string `json:"size"`
	MD5Hash string `json:"md5Hash"`
}

// newObject is an object's metadata as the API gives it.
func newObject(bucket, name string, body []byte) object {
	sum := md5.Sum(body)
	return object{Kind: "storage#object", Name: name, Bucket: bucket, Size: strconv.Itoa(len(body)), MD5Hash: base64.StdEncoding.EncodeToString(sum[:])}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	bucket := r.PathValue("bucket")
	q := r.URL.Query()
	max := 1000
	if n, err := strconv.Atoi(q.Get("maxResults")); err == nil && n > 0 && n < max {
		max = n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, ok := s.bucket(w, bucket)
	if !ok {
		return
	}
	var names []string
	for name := range objs {
		if strings.HasPrefix(name, q.Get("prefix")) && name > q.Get("pageToken") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := struct {
		Kind          string   `json:"kind"`
		Items         []object `json:"items,omitempty"`
		NextPageToken string   `json:"nextPageToken,omitempty"`
	}{Kind: "storage#objects"}
	if len(names) > max {
		names = names[:max]
		out.NextPageToken = names[max-1]
	}
	for _, n := range names {
		out.Items = append(out.Items, newObject(bucket, n, objs[n]))
	}
	writeJSON(w, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	bucket, name := r.PathValue("bucket"), r.PathValue("object")
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, ok := s.bucket(w, bucket)
	if !ok {
		return
	}
	body, ok := objs[name]
	if !ok {
		writeError(w, http.StatusNotFound, "No such object: "+bucket+"/"+name)
		return
	}
	if r.URL.Query().Get("alt") == "media" {
		s.downloads++
		s.readers = append(s.readers, bearer(r))
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
		return
	}
	writeJSON(w, newObject(bucket, name, body))
}

// insert stores an uploaded object: uploadType=media (the body, name in the query) or
// multipart (multipart/related: the object's JSON metadata, then its bytes).
func (s *Server) insert(w http.ResponseWriter, r *http.Request) {
	bucket, q := r.PathValue("bucket"), r.URL.Query()
	name, body, err := readUpload(r, q.Get("uploadType"), q.Get("name"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, ok := s.bucket(w, bucket)
	if !ok {
		return
	}
	s.writes = append(s.writes, Write{Method: http.MethodPost, Bucket: bucket, Name: name, Token: bearer(r)})
	objs[name] = body
	writeJSON(w, newObject(bucket, name, body))
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	bucket, name := r.PathValue("bucket"), r.PathValue("object")
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, ok := s.bucket(w, bucket)
	if !ok {
		return
	}
	if _, ok := objs[name]; !ok {
		writeError(w, http.StatusNotFound, "No such object: "+bucket+"/"+name)
		return
	}
	s.writes = append(s.writes, Write{Method: http.MethodDelete, Bucket: bucket, Name: name, Token: bearer(r)})
	delete(objs, name)
	w.WriteHeader(http.StatusNoContent)
}

// readUpload reads an insert's object name and bytes.
func readUpload(r *http.Request, uploadType, name string) (string, []byte, error) {
	switch uploadType {
	case "media":
		body, err := io.ReadAll(r.Body)
		if name == "" {
			return "", nil, errors.New("uploadType=media needs name")
		}
		return name, body, err
	case "multipart":
		mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || !strings.HasPrefix(mediaType, "multipart/") {
			return "", nil, errors.New("uploadType=multipart needs a multipart body")
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		var meta struct {
			Name string `json:"name"`
		}
		part, err := mr.NextPart()
		if err == nil {
			err = json.NewDecoder(part).Decode(&meta)
		}
		if err != nil {
			return "", nil, fmt.Errorf("multipart metadata: %v", err)
		}
		if part, err = mr.NextPart(); err != nil {
			return "", nil, fmt.Errorf("multipart media: %v", err)
		}
		body, err := io.ReadAll(part)
		if meta.Name == "" {
			meta.Name = name
		}
		return meta.Name, body, err
	}
	return "", nil, fmt.Errorf("uploadType %q is not modelled (media, multipart)", uploadType)
}

// bearer is the request's bearer token.
func bearer(r *http.Request) string {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return tok
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg,
		"errors": []map[string]string{{"message": msg, "domain": "global", "reason": "notFound"}}}})
}

// bucket is the named bucket's objects; a missing bucket answers 404, as GCS does. The
// caller holds s.mu.
func (s *Server) bucket(w http.ResponseWriter, name string) (map[string][]byte, bool) {
	objs, ok := s.buckets[name]
	if !ok {
		writeError(w, http.StatusNotFound, "The specified bucket does not exist.")
	}
	return objs, ok
}
