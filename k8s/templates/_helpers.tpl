{{/*
Names, labels and the values derived from other values. Every other template takes names and derived
values from here, so a rule (a name length, the EFA count of an instance type) lives in one place.
*/}}

{{/* The chart name, overridable. */}}
{{- define "trainer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/*
The resource name prefix. Truncated to 40 characters, not 63: pod hostnames append an index
(`<job>-<index>`, JobSet adds `-trainer-0-<index>`) and a hostname label may not exceed 63.
*/}}
{{- define "trainer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The standard labels. */}}
{{- define "trainer.labels" -}}
helm.sh/chart: {{ include "trainer.chart" . }}
{{ include "trainer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nvrx-eks-blueprint
{{- end }}

{{/* Selector labels: no version, so a selector never changes with an upgrade. */}}
{{- define "trainer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The trainer image, its tag defaulting to the chart's appVersion. */}}
{{- define "trainer.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString }}
{{- if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* vpc.amazonaws.com/efa per pod: efaPerNode, or the instance type's EFA interface count. */}}
{{- define "trainer.efaPerNode" -}}
{{- $byType := dict "p5.48xlarge" 32 "p5e.48xlarge" 32 "p5en.48xlarge" 16 "p4d.24xlarge" 4 }}
{{- if kindIs "invalid" .Values.efaPerNode }}
{{- get $byType .Values.instanceType | int }}
{{- else }}
{{- .Values.efaPerNode | int }}
{{- end }}
{{- end }}

{{/* The vocabulary size of a preset (for synthetic token files); mirrors trainer/model.py PRESETS. */}}
{{- define "trainer.vocabSize" -}}
{{- $byPreset := dict "tiny" 2048 "small" 32000 "1b" 128256 "8b" 128256 "70b" 128256 }}
{{- get $byPreset .Values.preset | int }}
{{- end }}

{{/* The run's name: its checkpoint and output directories are named after it. */}}
{{- define "trainer.runName" -}}
{{- .Values.runName | default (include "trainer.fullname" .) }}
{{- end }}

{{/* Where the node's NVMe RAID is mounted in the container. */}}
{{- define "trainer.localNvmeMount" -}}
/local-nvme
{{- end }}

{{/*
Pod 0's stable DNS name. The fully qualified name, not `<pod>.<service>`: pod 0 finds it in its own
/etc/hosts (the kubelet writes the FQDN there when the pod has a subdomain), so ft_launcher on pod 0
recognises itself as the rendezvous host without waiting for DNS; the other pods resolve it through the
headless Service, which publishes not-ready addresses, and their store clients retry until pod 0 listens.
*/}}
{{- define "trainer.rdzvHost" -}}
{{- $fullname := include "trainer.fullname" . }}
{{- $pod0 := printf "%s-0" $fullname }}
{{- if eq .Values.workload "jobset" }}
{{- $pod0 = printf "%s-trainer-0-0" $fullname }}
{{- end }}
{{- printf "%s.%s.%s.svc.%s" $pod0 $fullname .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* Pod labels: selector labels, the component, and the user's podLabels. */}}
{{- define "trainer.podLabels" -}}
{{ include "trainer.selectorLabels" . }}
app.kubernetes.io/component: trainer
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* nodeSelector: the user's map plus the instance type, so pods land only on the chosen node group. */}}
{{- define "trainer.nodeSelector" -}}
{{- $selector := merge (dict "node.kubernetes.io/instance-type" .Values.instanceType) .Values.nodeSelector }}
{{- toYaml $selector }}
{{- end }}

{{/*
Pod replacements allowed over all indexes: podRetriesTotal, or nodes x podRetriesPerIndex when null.
Takes .Values as its context.
*/}}
{{- define "trainer.podRetriesTotal" -}}
{{- if kindIs "invalid" .podRetriesTotal -}}
{{- mul (add (int .nodes) (int .spareNodes)) (int .podRetriesPerIndex) -}}
{{- else -}}
{{- int .podRetriesTotal -}}
{{- end -}}
{{- end }}
