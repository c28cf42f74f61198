// Package fakes3 is an in-process stand-in for Amazon S3 on loopback, for the subset Ferry's
// file_mounts use with path-style addressing: HeadBucket, ListObjectsV2 (prefix, max-keys,
// continuation tokens), GetObject and HeadObject, and for mounted buckets PutObject and
// DeleteObject, with S3's XML error envelope (NoSuchBucket, NoSuchKey) and statuses. Objects
// carry S3's ETag (the body's MD5, quoted) in listings and headers.
//
// Credentials: a request must carry either a SigV4 Authorization header (the SDK's own
// calls) or a presigned query (X-Amz-Algorithm AWS4-HMAC-SHA256, X-Amz-Credential,
// X-Amz-Date, X-Amz-Expires, X-Amz-SignedHeaders, X-Amz-Signature), and a presigned URL is
// refused once expired (403 AccessDenied). Signatures are not verified. Every presigned GET
// served is counted (Presigned), so a test can tell a VM used one; every write is recorded with
// the access key that signed it (Writes), so a test can tell whose credentials a mount used.
// A presigned URL only reads.
package fakes3

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Server is a fake S3. Zero buckets at first: Put makes them.
type Server struct {
	srv *httptest.Server

	mu        sync.Mutex
	buckets   map[string]map[string][]byte // bucket -> key -> body
	presigned int
	writes    []Write
}

// Write is one PutObject or DeleteObject served.
type Write struct {
	Method, Bucket, Key string
	// AccessKey is the access key id in the request's SigV4 credential scope.
	AccessKey string
	// SessionToken says the request carried X-Amz-Security-Token (temporary credentials,
	// such as an instance profile's).
	SessionToken bool
}

// New starts a server on loopback; Close stops it.
func New() *Server {
	s := &Server{buckets: map[string]map[string][]byte{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the endpoint, "http://127.0.0.1:PORT".
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Put stores an object, making its bucket.
func (s *Server) Put(bucket, key string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buckets[bucket] == nil {
		s.buckets[bucket] = map[string][]byte{}
	}
	s.buckets[bucket][key] = body
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
func (s *Server) Get(bucket, key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, ok := s.buckets[bucket][key]
	return body, ok
}

// Writes are the writes served, in order.
func (s *Server) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes)
}

// Presigned is how many presigned GETs were served.
func (s *Server) Presigned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.presigned
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	presigned := q.Get("X-Amz-Signature") != ""
	switch {
	case presigned:
		if msg := checkPresigned(q, time.Now()); msg != "" {
			writeError(w, http.StatusForbidden, "AccessDenied", msg)
			return
		}
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential="):
		writeError(w, http.StatusForbidden, "AccessDenied", "no SigV4 Authorization header")
		return
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	write := r.Method == http.MethodPut || r.Method == http.MethodDelete
	switch {
	case write && (presigned || key == ""):
		writeError(w, http.StatusForbidden, "AccessDenied", "this fake takes writes of objects, signed by a SigV4 header")
		return
	case !write && r.Method != http.MethodGet && r.Method != http.MethodHead:
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "not modelled")
		return
	}
	var body []byte
	if r.Method == http.MethodPut {
		var err error
		if body, err = readBody(r); err != nil {
			writeError(w, http.StatusBadRequest, "IncompleteBody", err.Error())
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, ok := s.buckets[bucket]
	if !ok {
		writeError(w, http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist")
		return
	}
	if write {
		s.writes = append(s.writes, Write{Method: r.Method, Bucket: bucket, Key: key,
			AccessKey: accessKey(r.Header.Get("Authorization")), SessionToken: r.Header.Get("X-Amz-Security-Token") != ""})
		if r.Method == http.MethodPut {
			objs[key] = body
			w.Header().Set("ETag", etag(body))
			return
		}
		delete(objs, key)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	switch {
	case key == "" && q.Get("list-type") == "2":
		s.list(w, bucket, objs, q)
	case key == "":
		w.Header().Set("X-Amz-Bucket-Region", "us-east-1")
	default:
		body, ok := objs[key]
		if !ok {
			writeError(w, http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
			return
		}
		if presigned && r.Method == http.MethodGet {
			s.presigned++
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Header().Set("ETag", etag(body))
		w.Header().Set("Last-Modified", time.Unix(0, 0).UTC().Format(http.TimeFormat))
		if r.Method == http.MethodGet {
			_, _ = w.Write(body)
		}
	}
}

// checkPresigned says what is wrong with a presigned query, "" when nothing.
func checkPresigned(q map[string][]string, now time.Time) string {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders"} {
		if get(k) == "" {
			return "presigned URL lacks " + k
		}
	}
	if get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" {
		return "unsupported algorithm"
	}
	date, err := time.Parse("20060102T150405Z", get("X-Amz-Date"))
	expires, err2 := strconv.Atoi(get("X-Amz-Expires"))
	if err != nil || err2 != nil || expires <= 0 || expires > 7*24*3600 {
		return "bad X-Amz-Date or X-Amz-Expires"
	}
	if now.After(date.Add(time.Duration(expires) * time.Second)) {
		return "Request has expired"
	}
	return ""
}

type listResult struct {
	XMLName               xml.Name   `xml:"http://s3.amazonaws.com/doc/2006-03-01/ ListBucketResult"`
	Name                  string     `xml:"Name"`
	Prefix                string     `xml:"Prefix"`
	KeyCount              int        `xml:"KeyCount"`
	MaxKeys               int        `xml:"MaxKeys"`
	IsTruncated           bool       `xml:"IsTruncated"`
	NextContinuationToken string     `xml:"NextContinuationToken,omitempty"`
	Contents              []listItem `xml:"Contents"`
}

type listItem struct {
	Key  string `xml:"Key"`
	Size int    `xml:"Size"`
	ETag string `xml:"ETag"`
}

// list answers ListObjectsV2: keys in order; the continuation token is the last key sent.
func (s *Server) list(w http.ResponseWriter, bucket string, objs map[string][]byte, q map[string][]string) {
	first := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	prefix := first("prefix")
	max := 1000
	if n, err := strconv.Atoi(first("max-keys")); err == nil && n > 0 && n < max {
		max = n
	}
	after := first("continuation-token")
	keys := make([]string, 0, len(objs))
	for k := range objs {
		if strings.HasPrefix(k, prefix) && k > after {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	res := listResult{Name: bucket, Prefix: prefix, MaxKeys: max}
	if len(keys) > max {
		res.IsTruncated = true
		keys = keys[:max]
		res.NextContinuationToken = keys[max-1]
	}
	for _, k := range keys {
		res.Contents = append(res.Contents, listItem{Key: k, Size: len(objs[k]), ETag: etag(objs[k])})
	}
	res.KeyCount = len(res.Contents)
	w.Header().Set("Content-Type", "application/xml")
	_ = xml.NewEncoder(w).Encode(res)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>", code, msg)
}

// etag is S3's ETag of a single-part object: its MD5, hex, quoted.
func etag(body []byte) string {
	sum := md5.Sum(body)
	return `"` + hex.EncodeToString(sum[:]) + `"`
}

// accessKey is the access key id in a SigV4 Authorization header's credential scope.
func accessKey(auth string) string {
	_, rest, _ := strings.Cut(auth, "Credential=")
	key, _, _ := strings.Cut(rest, "/")
	return key
}

// readBody reads a PutObject's body: as sent, or decoded from the SDK's aws-chunked encoding
// (chunks of hex size ";chunk-signature=..." CRLF data CRLF, then trailers), which it uses to
// send a checksum after the data.
func readBody(r *http.Request) ([]byte, error) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(r.Header.Get("Content-Encoding"), "aws-chunked") {
		return raw, nil
	}
	var out []byte
	for {
		line, rest, ok := bytes.Cut(raw, []byte("\r\n"))
		if !ok {
			return nil, errors.New("aws-chunked body ends in a chunk header")
		}
		sizeHex, _, _ := strings.Cut(string(line), ";")
		n, err := strconv.ParseInt(strings.TrimSpace(sizeHex), 16, 64)
		if err != nil || n < 0 || int64(len(rest)) < n {
			return nil, fmt.Errorf("bad aws-chunked chunk size %q", sizeHex)
		}
		if n == 0 {
			return out, nil
		}
		out = append(out, rest[:n]...)
		raw = bytes.TrimPrefix(rest[n:], []byte("\r\n"))
	}
}
