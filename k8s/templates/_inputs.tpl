{{/*
Checks of the user's maps, names and paths against what the chart itself renders. The reserved
names are DERIVED from the chart's own templates, rendered once with the user's additions left out: a
label, annotation or env name the chart sets, or a variable its command expands as $(NAME), cannot be
set again by podLabels, podAnnotations, podMonitor.labels, nodeSelector or extraEnv. A new entry in the
chart's env, labels or command is therefore reserved without editing any list here.

Included from trainer.podTemplate, so every workload (Job, JobSet) renders only after these pass.
*/}}

{{/*
The names the chart reserves, as JSON {"env": {NAME: why}, "labels": [...], "podLabels": [...],
"annotations": [...], "nodeSelector": [...]}. Takes the root context.
*/}}
{{- define "trainer.reservedNames" -}}
{{- $ctx := dict }}
{{- range $key, $value := . }}{{ $_ := set $ctx $key $value }}{{ end }}
{{- $values := dict }}
{{- range $key, $value := .Values }}{{ $_ := set $values $key $value }}{{ end }}
{{- $_ := set $values "extraEnv" dict }}
{{- $_ := set $values "extraTrainerArgs" list }}
{{- $_ := set $values "entrypointArgs" list }}
{{- $_ := set $values "podLabels" dict }}
{{- $_ := set $values "podAnnotations" dict }}
{{- $_ := set $values "nodeSelector" dict }}
{{- $_ := set $ctx "Values" $values }}
{{- $env := dict }}
{{- range (include "trainer.env" $ctx | fromYamlArray) }}
{{- $_ := set $env .name "the chart sets it" }}
{{- end }}
{{- $command := printf "%s\n%s" (include "trainer.args" $ctx) (include "trainer.trainerArgs" $ctx) }}
{{- range (regexFindAll "\\$\\([A-Za-z_][A-Za-z0-9_]*\\)" $command -1) }}
{{- $_ := set $env (trimSuffix ")" (trimPrefix "$(" .)) "the pod command expands it as $(...)" }}
{{- end }}
{{- $podLabels := keys (include "trainer.podLabels" $ctx | fromYaml) | sortAlpha }}
{{- $labels := keys (include "trainer.labels" $ctx | fromYaml) | sortAlpha }}
{{- $annotations := keys (include "trainer.chartPodAnnotations" $ctx | fromYaml | default dict) | sortAlpha }}
{{- $selector := keys (include "trainer.nodeSelector" $ctx | fromYaml) | sortAlpha }}
{{- /* The trainer flags the chart renders, by name without -- and no- (--no-inprocess is inprocess);
     --fault whether or not faults are set: the chart owns them. */}}
{{- $flags := dict "fault" "faults" }}
{{- /* The reference model's options too: after `--` they are its own, and before it (where
     extraTrainerArgs land) the trainer would refuse them at start instead of here. */}}
{{- $rendered := concat (include "trainer.trainerArgs" $ctx | fromYamlArray) (include "trainer.referenceArgs" $ctx | fromYamlArray) }}
{{- range $rendered }}
{{- if hasPrefix "--" . }}
{{- $flag := regexReplaceAll "=.*$" (trimPrefix "--" .) "" | trimPrefix "no-" }}
{{- $_ := set $flags $flag (include "trainer.valueOfFlag" $flag) }}
{{- end }}
{{- end }}
{{- dict "env" $env "podLabels" $podLabels "labels" $labels "annotations" $annotations "nodeSelector" $selector "flags" $flags | toJson }}
{{- end }}

{{/*
The chart value that renders a trainer flag (name without --): its camelCase, except where the value is
named otherwise or the flag is derived from several values.
*/}}
{{- define "trainer.valueOfFlag" -}}
{{- $named := dict "heartbeat-timeout" "ftRankHeartbeatTimeout" "fault" "faults" "data-path" "dataPath (or syntheticTokens)"
      "ckpt-dir" "storage.mountPath and runName" "ckpt-local-dir" "runName" "out-dir" "storage.mountPath and runName" }}
{{- get $named . | default (. | replace "-" "_" | camelcase | untitle) }}
{{- end }}

{{/*
Environment names extraEnv may never set, whatever the chart renders: the loader's and the
interpreter's search paths and start-up hooks (a user's PATH or LD_PRELOAD replaces what runs).
*/}}
{{- define "trainer.deniedEnvPattern" -}}
^(PATH|PYTHONPATH|PYTHONHOME|PYTHONSTARTUP|PYTHONUSERBASE|PYTHONINSPECT|PYTHONEXECUTABLE|PYTHONSAFEPATH|PYTHONNOUSERSITE|BASH_ENV|ENV|IFS|LD_[A-Z0-9_]*|DYLD_[A-Z0-9_]*|TORCHELASTIC_[A-Z0-9_]*)$
{{- end }}

{{/*
The trainer settings extraEnv may set, with the form the trainer parses (trainer/config/inputs.py ENV_SETTINGS
is the other half; tests/chart keeps the two in step). Seconds: a plain decimal above 0, at most a week.
*/}}
{{- define "trainer.trainerEnvForms" -}}
{{- $seconds := "^[+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+)?$" }}
{{- dict
      "TRAINER_INPROCESS_MONITOR_INTERVAL" (list "seconds" $seconds)
      "TRAINER_INPROCESS_LAST_CALL_WAIT" (list "seconds" $seconds)
      "TRAINER_LOG_LEVEL" (list "level" "^(CRITICAL|FATAL|ERROR|WARN|WARNING|INFO|DEBUG|NOTSET)$")
    | toJson }}
{{- end }}

{{/* The longest any seconds-valued setting may be (a week), as in trainer/config/inputs.py MAX_SECONDS. */}}
{{- define "trainer.maxSeconds" -}}604800{{- end }}

{{/*
System paths no volume may be mounted on or taken from: exact entries refuse the path itself, "under"
entries the path and everything below it. Mounting over /usr hides the image's Python; a hostPath of /
or /var/lib/kubelet hands the node (and other pods' secrets) to the trainer.
*/}}
{{- define "trainer.systemPaths" -}}
{{- dict
      "exact" (list "/" "/var" "/var/lib" "/home" "/opt" "/mnt" "/srv" "/tmp" "/root")
      "under" (list "/bin" "/boot" "/dev" "/etc" "/lib" "/lib32" "/lib64" "/libx32" "/proc" "/run" "/sbin" "/sys" "/usr" "/var/lib/kubelet" "/var/lib/containerd" "/var/lib/docker" "/var/run" "/var/log")
    | toJson }}
{{- end }}

{{/* Fail if (list field path) is a system path; see trainer.systemPaths. */}}
{{- define "trainer.requireNonSystemPath" -}}
{{- $field := index . 0 }}
{{- $path := index . 1 }}
{{- $clean := $path }}
{{- if ne $path "/" }}{{ $clean = trimSuffix "/" $path }}{{ end }}
{{- $system := include "trainer.systemPaths" . | fromJson }}
{{- range $system.exact }}
{{- if eq $clean . }}
{{- fail (printf "%s: %q is a system path; use a directory of its own (e.g. /fsx, /mnt/nvme)" $field $path) }}
{{- end }}
{{- end }}
{{- range $system.under }}
{{- if or (eq $clean .) (hasPrefix (printf "%s/" .) $clean) }}
{{- fail (printf "%s: %q is or lies under the system path %s; use a directory of its own (e.g. /fsx, /mnt/nvme)" $field $path .) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Every check of this file; takes the root context. */}}
{{- define "trainer.validateInputs" -}}
{{- $v := .Values }}
{{- $reserved := include "trainer.reservedNames" . | fromJson }}
{{- $denied := include "trainer.deniedEnvPattern" . }}
{{- $forms := include "trainer.trainerEnvForms" . | fromJson }}
{{- range $name := keys $v.extraEnv | sortAlpha }}
{{- $value := get $v.extraEnv $name }}
{{- if hasKey $reserved.env $name }}
{{- fail (printf "extraEnv.%s: reserved: %s" $name (get $reserved.env $name)) }}
{{- end }}
{{- if regexMatch $denied $name }}
{{- fail (printf "extraEnv.%s: may not be set (it changes which programs or libraries the pod runs)" $name) }}
{{- end }}
{{- if hasKey $forms $name }}
{{- $form := get $forms $name }}
{{- if not (regexMatch (index $form 1) $value) }}
{{- fail (printf "extraEnv.%s: %q is not in the form the trainer reads (%s)" $name $value (index $form 0)) }}
{{- end }}
{{- if eq (index $form 0) "seconds" }}
{{- $seconds := float64 $value }}
{{- if or (le $seconds 0.0) (gt $seconds (include "trainer.maxSeconds" . | float64)) }}
{{- fail (printf "extraEnv.%s: %q must be above 0 and at most %s seconds (a week)" $name $value (include "trainer.maxSeconds" .)) }}
{{- end }}
{{- end }}
{{- else if hasPrefix "TRAINER_" $name }}
{{- fail (printf "extraEnv.%s: the trainer reads no such setting (it reads %s)" $name (keys $forms | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- /* extraTrainerArgs come after the chart's flags, and argparse keeps the last of a repeated flag: one
     that repeats (or abbreviates) a flag the chart sets would override a value every check here read. */}}
{{- range $i, $arg := $v.extraTrainerArgs }}
{{- if and (hasPrefix "-" $arg) (ne $arg "--") }}
{{- $flag := regexReplaceAll "=.*$" (trimPrefix "-" (trimPrefix "-" $arg)) "" }}
{{- $base := trimPrefix "no-" $flag }}
{{- if hasKey $reserved.flags $base }}
{{- fail (printf "extraTrainerArgs[%d]: %q repeats --%s, which the chart sets from the value %s; set that value instead" $i $arg $base (get $reserved.flags $base)) }}
{{- end }}
{{- if has $base (list "check-config" "help" "h") }}
{{- fail (printf "extraTrainerArgs[%d]: %q would make the trainer container exit without training (the chart runs --check-config in its own init container)" $i $arg) }}
{{- end }}
{{- range $chartFlag := keys $reserved.flags | sortAlpha }}
{{- if and $base (hasPrefix $base $chartFlag) }}
{{- fail (printf "extraTrainerArgs[%d]: %q abbreviates --%s, which the chart sets from the value %s; set that value instead" $i $arg $chartFlag (get $reserved.flags $chartFlag)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- /* The Job's FailJob codes: 2 (a configuration error, the check-config init container's exit, which no
     restart fixes) and 93 (ft_launcher's do-not-restart verdict) must stay, or both are retried. */}}
{{- $codes := list }}
{{- range $v.failJobExitCodes }}{{ $codes = append $codes (int .) }}{{ end }}
{{- range $code := list 2 93 }}
{{- if not (has $code $codes) }}
{{- fail (printf "failJobExitCodes: %v drops %d; keep 2 (configuration errors) and 93 (ft_launcher's do-not-restart verdict) and add your codes" $v.failJobExitCodes $code) }}
{{- end }}
{{- end }}
{{- range $name := keys $v.podLabels | sortAlpha }}
{{- if has $name $reserved.podLabels }}
{{- fail (printf "podLabels.%s: reserved: the chart sets this label (the Service, NetworkPolicy and PodMonitor select pods by it)" $name) }}
{{- end }}
{{- end }}
{{- range $name := keys $v.podAnnotations | sortAlpha }}
{{- if has $name $reserved.annotations }}
{{- fail (printf "podAnnotations.%s: reserved: the chart sets this annotation (metricsScrapeAnnotations)" $name) }}
{{- end }}
{{- end }}
{{- range $name := keys (default dict $v.podMonitor.labels) | sortAlpha }}
{{- if has $name $reserved.labels }}
{{- fail (printf "podMonitor.labels.%s: reserved: the chart sets this label on every object" $name) }}
{{- end }}
{{- end }}
{{- range $name := keys $v.nodeSelector | sortAlpha }}
{{- if has $name $reserved.nodeSelector }}
{{- fail (printf "nodeSelector.%s: reserved: the chart sets it from instanceType" $name) }}
{{- end }}
{{- end }}
{{- include "trainer.requireNonSystemPath" (list "storage.localNvmePath" $v.storage.localNvmePath) }}
{{- include "trainer.requireNonSystemPath" (list "storage.mountPath" $v.storage.mountPath) }}
{{- end }}
