{{/* The chart's name, or nameOverride. */}}
{{- define "xdsrelay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release's name if it holds the
chart's (helm install xdsrelay ... names everything xdsrelay, as deploy/'s
manifests do), else release-chart.
*/}}
{{- define "xdsrelay.fullname" -}}
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

{{/* The labels the selectors match. */}}
{{- define "xdsrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "xdsrelay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "xdsrelay.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "xdsrelay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "xdsrelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "xdsrelay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the admin Secret is mounted. */}}
{{- define "xdsrelay.adminTLSDir" -}}
/etc/xdsrelay-admin-tls
{{- end }}

{{/*
The relay's configuration: .Values.config with the listen addresses on the
container ports, and admin.local_address on 127.0.0.1 at ports.adminLocal.
*/}}
{{- define "xdsrelay.config" -}}
{{- $admin := dict "address" (printf "0.0.0.0:%d" (int .Values.ports.admin)) "local_address" (printf "127.0.0.1:%d" (int .Values.ports.adminLocal)) }}
{{- $listen := dict "downstream" (dict "address" (printf "0.0.0.0:%d" (int .Values.ports.xds))) "admin" $admin }}
{{- toYaml (mergeOverwrite (deepCopy .Values.config) $listen) }}
{{- end }}

{{/*
GOMEMLIMIT in bytes: goMemLimitRatio of resources.limits.memory (a Kubernetes
quantity: a number with an optional binary or decimal suffix); empty without
a memory limit.
*/}}
{{- define "xdsrelay.goMemLimit" -}}
{{- with dig "limits" "memory" "" .Values.resources }}
{{- $q := toString . }}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q }}
{{- $unit := trimPrefix $num $q }}
{{- if and $unit (not (hasKey $units $unit)) }}
{{- fail (printf "resources.limits.memory: %q: want a number with Ki, Mi, Gi, Ti, k, M, G or T" $q) }}
{{- end }}
{{- $mult := 1 }}
{{- if $unit }}{{ $mult = get $units $unit }}{{ end }}
{{- mulf $num $mult $.Values.goMemLimitRatio | floor | int64 }}
{{- end }}
{{- end }}
