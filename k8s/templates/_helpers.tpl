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
helm.sh/chart: {{ include "trainer.chart" . | quote }}
{{ include "trainer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: nvrx-eks-blueprint
{{- end }}

{{/* Selector labels: no version, so a selector never changes with an upgrade. */}}
{{- define "trainer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainer.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
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

{{/* The instance type's facts (gpus, efaInterfaces, ...) as JSON, from instance-types.json: the table
infra/instance_types.py loads too, so chart and infra cannot disagree. */}}
{{- define "trainer.instanceFacts" -}}
{{- $types := (.Files.Get "instance-types.json" | fromJson).types }}
{{- get $types .Values.instanceType | toJson }}
{{- end }}

{{/* vpc.amazonaws.com/efa per pod: efaPerNode, or the instance type's EFA interface count. */}}
{{- define "trainer.efaPerNode" -}}
{{- if kindIs "invalid" .Values.efaPerNode }}
{{- (include "trainer.instanceFacts" . | fromJson).efaInterfaces | int }}
{{- else }}
{{- .Values.efaPerNode | int }}
{{- end }}
{{- end }}

{{/* The longest sequence a preset supports (its RoPE table); mirrors trainer/reference/model.py PRESETS. */}}
{{- define "trainer.maxSeqLen" -}}
{{- $byPreset := dict "tiny" 512 "small" 2048 "1b" 8192 "8b" 8192 "70b" 8192 }}
{{- get $byPreset .Values.preset | int }}
{{- end }}

{{/* The vocabulary size of a preset (for synthetic token files); mirrors trainer/reference/model.py PRESETS. */}}
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

{{/* The rendezvous service's name (templates/rendezvous.yaml). */}}
{{- define "trainer.rendezvousName" -}}
{{- printf "%s-rendezvous" (include "trainer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The rendezvous endpoint's host: the rendezvous service's fully qualified Service name. No training pod
hosts the store (docs/failure-domains.md): no launcher's host name matches it, so every launcher is a client.
*/}}
{{- define "trainer.rdzvHost" -}}
{{- printf "%s.%s.svc.%s" (include "trainer.rendezvousName" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* Pod labels: selector labels, the component, and the user's podLabels. */}}
{{- define "trainer.podLabels" -}}
{{ include "trainer.selectorLabels" . }}
app.kubernetes.io/component: trainer
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Tolerations of every pod on the GPU nodes: the GPU node group's taint (infra/gpu_nodegroup.py),
always, then the user's tolerations, which add to it and never replace it. */}}
{{- define "trainer.tolerations" -}}
- key: nvidia.com/gpu
  operator: Equal
  value: "true"
  effect: NoSchedule
{{- with .Values.tolerations }}
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
