// Package fakegcs is an in-process stand-in for the Google Cloud Storage JSON API on loopback,
// for the subset Ferry's file_mounts use: objects.list (prefix, pageToken, maxResults),
// objects.get (metadata, and the object's bytes with alt=media), with the API's JSON error
// envelope (404 for a missing bucket or object).
//
// Credentials: with Options.Token set, every request must carry "Authorization: Bearer
// TOKEN" (401 without, 403 with another); this is how a test tells that a VM used the token
// its metadata server gave. Media downloads are counted (Downloads).
package fakegcs

import (
	"encoding/json"
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
}

// New starts a server on loopback; Close stops it.
func New(opts Options) *Server {
	s := &Server{opts: opts, buckets: map[string]map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /storage/v1/b/{bucket}/o", s.list)
	mux.HandleFunc("GET /storage/v1/b/{bucket}/o/{object...}", s.get)
	s.srv = httptest.NewServer(s.auth(mux))
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
			case got != s.opts.Token:
				writeError(w, http.StatusForbidden, "The caller does not have permission")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

type object struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Bucket string `json:"bucket"`
	Size   string `json:"size"`
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
	objs, ok := s.buckets[bucket]
	if !ok {
		writeError(w, http.StatusNotFound, "The specified bucket does not exist.")
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
		out.Items = append(out.Items, object{Kind: "storage#object", Name: n, Bucket: bucket, Size: strconv.Itoa(len(objs[n]))})
	}
	writeJSON(w, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	bucket, name := r.PathValue("bucket"), r.PathValue("object")
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, ok := s.buckets[bucket]
	if !ok {
		writeError(w, http.StatusNotFound, "The specified bucket does not exist.")
		return
	}
	body, ok := objs[name]
	if !ok {
		writeError(w, http.StatusNotFound, "No such object: "+bucket+"/"+name)
		return
	}
	if r.URL.Query().Get("alt") == "media" {
		s.downloads++
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
		return
	}
	writeJSON(w, object{Kind: "storage#object", Name: name, Bucket: bucket, Size: strconv.Itoa(len(body))})
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
