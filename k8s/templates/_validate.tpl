{{/*
Checks JSON schema cannot express because they compare two values. Rendered (as nothing) by every
workload template, so `helm lint`, `helm template` and `helm install` all fail on bad combinations.
*/}}

{{/* Fails unless each timeout in the list (pairs of name and value) is less than the next one. */}}
{{- define "trainer.requireIncreasing" -}}
{{- $chain := . }}
{{- range $i, $pair := $chain }}
{{- if lt (add1 $i) (len $chain) }}
{{- $next := index $chain (add1 $i) }}
{{- if not (lt (float64 (index $pair 1)) (float64 (index $next 1))) }}
{{- fail (printf "timeouts must nest: %s (%v s) must be less than %s (%v s); see values.yaml" (index $pair 0) (index $pair 1) (index $next 0) (index $next 1)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainer.validate" -}}
{{- $v := .Values }}
{{- /* The trainer checks this chain at start-up (trainer/resilience/timeouts.py), whatever inprocess
     is; failing here surfaces it at install time instead of as a crashing pod. */}}
{{- include "trainer.requireIncreasing" (list
      (list "collectiveTimeout" $v.collectiveTimeout)
      (list "inprocessSoftTimeout" $v.inprocessSoftTimeout)
      (list "inprocessHardTimeout" $v.inprocessHardTimeout)
      (list "inprocessBarrierTimeout" $v.inprocessBarrierTimeout)
      (list "ftRankHeartbeatTimeout" $v.ftRankHeartbeatTimeout)) }}
{{- if gt (float64 $v.ftRankHeartbeatTimeout) (float64 $v.ftInitialRankHeartbeatTimeout) }}
{{- fail (printf "timeouts must nest: ftRankHeartbeatTimeout (%v s) must not exceed ftInitialRankHeartbeatTimeout (%v s); see values.yaml" $v.ftRankHeartbeatTimeout $v.ftInitialRankHeartbeatTimeout) }}
{{- end }}
{{- if gt (float64 $v.inprocessLivenessTimeout) (float64 $v.inprocessHardTimeout) }}
{{- fail (printf "timeouts must nest: inprocessLivenessTimeout (%v s) must not exceed inprocessHardTimeout (%v s); see values.yaml" $v.inprocessLivenessTimeout $v.inprocessHardTimeout) }}
{{- end }}
{{- if le (float64 $v.inprocessLivenessTimeout) 1.0 }}
{{- fail (printf "inprocessLivenessTimeout (%v s) must exceed the Wrapper's 1 s heartbeat interval" $v.inprocessLivenessTimeout) }}
{{- end }}
{{- include "trainer.requireIncreasing" (list
      (list "ftWorkloadCheckInterval" $v.ftWorkloadCheckInterval)
      (list "ftRankHeartbeatTimeout" $v.ftRankHeartbeatTimeout)) }}
{{- include "trainer.requireIncreasing" (list
      (list "monitorInterval" $v.monitorInterval)
      (list "ftRankHeartbeatTimeout" $v.ftRankHeartbeatTimeout)) }}
{{- $previous := 0 }}
{{- range $v.failJobExitCodes }}
{{- if le (int .) $previous }}
{{- fail (printf "failJobExitCodes must be in increasing order without repeats (Kubernetes requires it); got %v" $v.failJobExitCodes) }}
{{- end }}
{{- $previous = int . }}
{{- end }}
{{- if and (eq $v.workload "jobset") (not ($.Capabilities.APIVersions.Has "jobset.x-k8s.io/v1alpha2")) }}
{{- fail "workload=jobset needs the JobSet controller (API jobset.x-k8s.io/v1alpha2) in the cluster; install it or use workload=job" }}
{{- end }}
{{- end }}
