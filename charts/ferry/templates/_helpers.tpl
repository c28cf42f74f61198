{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "ferry.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. app.kubernetes.io/name is what replicas' NetworkPolicies admit. */}}
{{- define "ferry.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component (controller or proxy): pass (list $ "controller"). */}}
{{- define "ferry.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "ferry.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "ferry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ferry.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ferry.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ferry.replicasNamespace" -}}
{{- default .Release.Namespace .Values.replicas.namespace -}}
{{- end -}}

{{- define "ferry.controllerService" -}}
{{- printf "%s-controller" (include "ferry.fullname" .) -}}
{{- end -}}

{{- define "ferry.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "ferry.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "ferry.controllerTLSSecret" -}}
{{- default (printf "%s-controller-tls" (include "ferry.fullname" .)) .Values.tls.controller.secretName -}}
{{- end -}}

{{/* The controller API's URL as proxies reach it: the Service, over HTTPS. */}}
{{- define "ferry.controllerURL" -}}
{{- printf "https://%s.%s.svc:%d" (include "ferry.controllerService" .) .Release.Namespace (int .Values.controller.apiPort) -}}
{{- end -}}

{{/*
The name of a cluster-scoped object of this release (admission policies and their bindings,
the ClusterRole): pass (list $ "fence"). Both the release and its namespace are in it, since two
releases may share a namespace and two namespaces may each hold a release of the same name. The
release "ferry" keeps the names it had before they were release-scoped (ferry-fence-NAMESPACE).
*/}}
{{- define "ferry.clusterName" -}}
{{- $ := index . 0 -}}
{{- printf "%s-%s-%s" (include "ferry.fullname" $) (index . 1) $.Release.Namespace -}}
{{- end -}}

{{/* The claim holding FERRY_HOME of a controller with the SQLite store. */}}
{{- define "ferry.stateClaim" -}}
{{- default (printf "%s-state" (include "ferry.fullname" .)) .Values.controller.persistence.existingClaim -}}
{{- end -}}

{{/*
"true" when each FerryService gets a Service of its own leading to the proxies (values.yaml,
proxy.serviceEndpoints): proxies that front every service, FerryServices followed (the
kubernetes store), and the value on. With proxy.httpRoute.parentRefs it must be.
*/}}
{{- define "ferry.serviceEndpoints" -}}
{{- $on := and .Values.proxy.enabled (eq (toString .Values.proxy.attach) "*") .Values.proxy.serviceEndpoints (eq .Values.controller.store "kubernetes") -}}
{{- if and .Values.proxy.httpRoute.parentRefs (not $on) -}}
{{- fail "proxy.httpRoute.parentRefs: HTTPRoutes lead to FerryServices' own Services, which need proxy.enabled, proxy.attach=\"*\", proxy.serviceEndpoints=true and controller.store=kubernetes" -}}
{{- end -}}
{{- if and .Values.proxy.httpRoute.parentRefs (not (contains "{name}" .Values.proxy.httpRoute.hostname)) -}}
{{- fail (printf "proxy.httpRoute.hostname %q: with parentRefs, a hostname holding {name}, such as \"{name}.llm.example.com\", so that each FerryService's route has a host of its own" .Values.proxy.httpRoute.hostname) -}}
{{- end -}}
{{- if $on }}true{{ end -}}
{{- end -}}

{{/*
"true" when the proxies' HPA scales on their load (proxy.autoscaling.metric: load): the controller
then serves external.metrics.k8s.io behind the APIService in external-metrics.yaml.
*/}}
{{- define "ferry.loadMetric" -}}
{{- if and .Values.proxy.enabled .Values.proxy.autoscaling.enabled (eq .Values.proxy.autoscaling.metric "load") -}}
true
{{- end -}}
{{- end -}}

{{/*
The controller's self-signed certificate, as JSON {"crt", "key"} (base64 PEM): the one an earlier
install stored, else a new one for the controller Service's names. It is made once per render
and kept in .Values, since the TLS Secret (secrets.yaml) and the APIService's caBundle
(external-metrics.yaml) must carry the same certificate and each genSelfSignedCert makes a new one.
*/}}
{{- define "ferry.controllerSelfSigned" -}}
{{- if not (hasKey .Values "ferryRenderedControllerTLS") }}
{{- $old := (lookup "v1" "Secret" .Release.Namespace (include "ferry.controllerTLSSecret" .)).data | default dict }}
{{- $svc := include "ferry.controllerService" . }}
{{- $ns := .Release.Namespace }}
{{- $crt := get $old "tls.crt" }}
{{- $key := get $old "tls.key" }}
{{- if not (and $crt $key) }}
{{- $cert := genSelfSignedCert $svc nil (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) 3650 }}
{{- $crt = $cert.Cert | b64enc }}
{{- $key = $cert.Key | b64enc }}
{{- end }}
{{- $_ := set .Values "ferryRenderedControllerTLS" (dict "crt" $crt "key" $key) }}
{{- end }}
{{- toJson .Values.ferryRenderedControllerTLS }}
{{- end -}}
