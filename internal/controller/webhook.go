package controller

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The FerryService webhook: the CRD's schema and CEL rules cannot say everything configs
// checks (the keys of replica_policy, probe and autoscaler rules, cross-field rules), so the
// API server asks the controller, which runs the very validation a task file gets, and refuses
// what it refuses at `kubectl apply` time with configs' own message, and the tenancy rules
// a FerryService is held to (tenancy.go: no paths on the controller's host, no infra local,
// no buckets read with the controller's credentials). Every controller serves
// it, follower or leader: it reads no state. Without the webhook installed, the same check
// still runs before anything launches and shows in the object's status (ferryservices.go).

// WebhookOptions serve the FerryService validating webhook (off when Addr is empty).
type WebhookOptions struct {
	// Addr is host:port; CertFile and KeyFile are its TLS certificate and key (PEM), which the
	// ValidatingWebhookConfiguration's caBundle must verify.
	Addr, CertFile, KeyFile string
}

// WebhookPath is where the webhook answers AdmissionReviews.
const WebhookPath = "/validate-ferryservice"

// maxReviewBytes bounds an AdmissionReview's body (a FerryService is far smaller).
const maxReviewBytes = 4 << 20

// startWebhook serves the webhook when configured; stop shuts it down.
func (c *Controller) startWebhook() (stop func(), err error) {
	o := c.opts.Webhook
	if o.Addr == "" {
		return func() {}, nil
	}
	if o.CertFile == "" || o.KeyFile == "" {
		return nil, errors.New("the FerryService webhook needs a TLS certificate and key: the API server calls it over HTTPS only")
	}
	cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+WebhookPath, c.reviewFerryService)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	c.spawn(nil, "webhook", func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("FerryService webhook stopped", zap.Error(err))
		}
	})
	c.log.Info("FerryService webhook serving", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// reviewFerryService answers one AdmissionReview of a FerryService's create or update.
func (c *Controller) reviewFerryService(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "want an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	var u unstructured.Unstructured
	if err := json.Unmarshal(review.Request.Object.Raw, &u.Object); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonBadRequest, Code: http.StatusBadRequest, Message: err.Error()}
	} else if _, _, err := parseFerryService(&u); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonInvalid, Code: http.StatusUnprocessableEntity, Message: err.Error()}
	}
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}
