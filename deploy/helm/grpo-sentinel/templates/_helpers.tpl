{{/*
The chart's name.
*/}}
{{- define "grpo-sentinel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object. Truncated at 63 characters (DNS label names); the release name alone
when it already contains the chart's name.
*/}}
{{- define "grpo-sentinel.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "grpo-sentinel.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "grpo-sentinel.labels" -}}
helm.sh/chart: {{ include "grpo-sentinel.chart" . }}
{{ include "grpo-sentinel.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: grpo-sentinel
{{- end }}

{{/*
Selector labels: stable across upgrades (a Deployment's selector is immutable).
*/}}
{{- define "grpo-sentinel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "grpo-sentinel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "grpo-sentinel.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "grpo-sentinel.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The Secret with the API token and the Langfuse keys: the user's, or the chart's.
*/}}
{{- define "grpo-sentinel.secretName" -}}
{{- default (include "grpo-sentinel.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "grpo-sentinel.claimName" -}}
{{- default (include "grpo-sentinel.fullname" .) .Values.persistence.existingClaim }}
{{- end }}

{{- define "grpo-sentinel.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Paths inside the container; the daemon's flags and the volumes agree on them.
*/}}
{{- define "grpo-sentinel.stateDir" -}}/var/lib/grpo-sentinel{{- end }}
{{- define "grpo-sentinel.runConfig" -}}/etc/grpo-sentinel/run.yaml{{- end }}

{{/*
The container's resources: .Values.resources with the GPU limit added (extended resources are
requested at their limit).
*/}}
{{- define "grpo-sentinel.resources" -}}
{{- $resources := deepCopy .Values.resources }}
{{- if gt (int .Values.gpu.count) 0 }}
{{- $limits := default dict $resources.limits }}
{{- $_ := set $limits .Values.gpu.resourceName (int .Values.gpu.count) }}
{{- $_ := set $resources "limits" $limits }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{/*
OTEL_RESOURCE_ATTRIBUTES: the pod, namespace and node (from the downward API variables defined
before it), then .Values.otel.resourceAttributes.
*/}}
{{- define "grpo-sentinel.resourceAttributes" -}}
{{- $attrs := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.node.name=$(NODE_NAME)" }}
{{- range $k, $v := .Values.otel.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k (toString $v)) }}
{{- end }}
{{- join "," $attrs }}
{{- end }}

{{/*
A map as "k=v, k=v", for NOTES.txt.
*/}}
{{- define "grpo-sentinel.inline" -}}
{{- $pairs := list }}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%v" $k $v) }}{{ end }}
{{- join ", " $pairs }}
{{- end }}
