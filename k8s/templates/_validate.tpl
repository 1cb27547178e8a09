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

{{/*
Fails unless every key of the map (list of value name and map) matches the pattern (list of regex and what
it is). A key "true" or "false" is refused whatever the pattern: Helm reads values as YAML 1.1, so an
unquoted y, yes, on (n, no, off) key arrives as "true" ("false"), and two of them silently become one.
*/}}
{{- define "trainer.requireKeys" -}}
{{- $name := index . 0 }}
{{- range $key, $_ := index . 1 }}
{{- if has $key (list "true" "false") }}
{{- fail (printf "%s: key %q is how Helm reads an unquoted y/yes/on/true (n/no/off/false) key (YAML 1.1 booleans); quote the key as you mean it" $name $key) }}
{{- end }}
{{- if not (regexMatch (index $ 2) $key) }}
{{- fail (printf "%s: key %q is not %s" $name $key (index $ 3)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A Kubernetes quantity (list of value name and quantity) in base units, as a float string. */}}
{{- define "trainer.quantityValue" -}}
{{- $name := index . 0 }}
{{- $q := index . 1 | toString }}
{{- $scale := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$" $q) }}
{{- fail (printf "%s: %q is not a Kubernetes quantity" $name $q) }}
{{- end }}
{{- $number := regexReplaceAll "^([0-9.]+)([a-zA-Z]*)$" $q "${1}" }}
{{- $suffix := regexReplaceAll "^([0-9.]+)([a-zA-Z]*)$" $q "${2}" }}
{{- mulf (float64 $number) (get $scale $suffix) }}
{{- end }}

{{/* Fails when two mount paths (list of pairs of what and path) are equal or one lies inside the other. */}}
{{- define "trainer.requireDistinctMounts" -}}
{{- $mounts := . }}
{{- range $i, $a := $mounts }}
{{- range $j, $b := $mounts }}
{{- if lt $i $j }}
{{- $pa := printf "%s/" (trimSuffix "/" (index $a 1)) }}
{{- $pb := printf "%s/" (trimSuffix "/" (index $b 1)) }}
{{- if or (hasPrefix $pa $pb) (hasPrefix $pb $pa) }}
{{- fail (printf "%s (%s) collides with %s (%s): mount paths must not be equal or nested" (index $a 0) (index $a 1) (index $b 0) (index $b 1)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Fails unless every fault spec names one step the run reaches, and ranks and nodes that exist. */}}
{{- define "trainer.requireReachableFaults" -}}
{{- $v := .Values }}
{{- $world := mul (int $v.nodes) (int $v.gpusPerNode) }}
{{- range $name := keys $v.faults | sortAlpha }}
{{- $spec := get $v.faults $name }}
{{- $parts := splitList ":" $spec }}
{{- $kind := first $parts }}
{{- $seen := dict }}
{{- range rest $parts }}
{{- $kv := splitList "=" . }}
{{- if hasKey $seen (first $kv) }}
{{- fail (printf "faults.%s: %q gives %s twice" $name $spec (first $kv)) }}
{{- end }}
{{- $_ := set $seen (first $kv) (last $kv) }}
{{- end }}
{{- if not (hasKey $seen "step") }}
{{- fail (printf "faults.%s: %q needs step=N (the global step where it fires)" $name $spec) }}
{{- end }}
{{- $step := get $seen "step" | int }}
{{- $last := sub (int $v.steps) 1 }}
{{- if and (eq $kind "slow") (not (hasKey $seen "factor")) }}
{{- fail (printf "faults.%s: %q: slow needs factor=F" $name $spec) }}
{{- end }}
{{- if and (hasKey $seen "factor") (not (has $kind (list "slow" "spike"))) }}
{{- fail (printf "faults.%s: %q: factor=F is for slow and spike only" $name $spec) }}
{{- end }}
{{- if and (eq $kind "slow") (hasKey $seen "factor") (or (le (float64 (get $seen "factor")) 1.0) (gt (float64 (get $seen "factor")) 100.0)) }}
{{- fail (printf "faults.%s: %q: factor must be > 1 and <= 100" $name $spec) }}
{{- end }}
{{- if and (eq $kind "slow") (hasKey $seen "rank") (hasKey $seen "node") }}
{{- fail (printf "faults.%s: %q: slow takes rank=R or node=K, not both" $name $spec) }}
{{- end }}
{{- if has $kind (list "ckpt-crash" "ckpt-write-error") }}
{{- /* It fires in the first save at or after its step (trainer/state/cadence.py next_due). The run's
     last step always saves (cadence.is_due), so whatever ckptInterval is, there is such a save exactly
     when the step is in the run (tests/trainer/config/test_chart_agreement.py checks both agree). */}}
{{- if gt $step $last }}
{{- fail (printf "faults.%s: %q never fires: no checkpoint is saved at or after step %d (steps %d: the last save follows step %d)" $name $spec $step (int $v.steps) $last) }}
{{- end }}
{{- else if gt $step $last }}
{{- fail (printf "faults.%s: %q never fires: steps are 0 to %d (steps %d)" $name $spec $last (int $v.steps)) }}
{{- end }}
{{- $rank := get $seen "rank" }}
{{- if and $rank (ne $rank "random") (ge (int $rank) $world) }}
{{- fail (printf "faults.%s: %q names rank %s, but the run has %d ranks (nodes x gpusPerNode)" $name $spec $rank $world) }}
{{- end }}
{{- $node := get $seen "node" }}
{{- if and $node (ge (int $node) (int $v.nodes)) }}
{{- fail (printf "faults.%s: %q names node %s, but the run has %d nodes" $name $spec $node (int $v.nodes)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Fails unless each toleration (list of value name and list) keeps the API server's rules that span fields
(core/v1 validation): a key is a qualified name, or empty with operator Exists; Exists takes no value;
Equal's value is a label value; tolerationSeconds only with effect NoExecute.
*/}}
{{- define "trainer.requireTolerations" -}}
{{- $name := index . 0 }}
{{- $qualifiedName := index . 2 }}
{{- range $i, $t := index . 1 }}
{{- $key := $t.key | default "" }}
{{- $op := $t.operator | default "Equal" }}
{{- $value := $t.value | default "" }}
{{- if and (eq $key "") (ne $op "Exists") }}
{{- fail (printf "%s[%d]: a toleration without a key must use operator Exists (it tolerates every taint)" $name $i) }}
{{- end }}
{{- if and $key (not (regexMatch $qualifiedName $key)) }}
{{- fail (printf "%s[%d].key: %q is not a Kubernetes qualified name ([prefix/]name)" $name $i $key) }}
{{- end }}
{{- if and (eq $op "Exists") $value }}
{{- fail (printf "%s[%d].value: must be empty with operator Exists (got %q)" $name $i $value) }}
{{- end }}
{{- if and (eq $op "Equal") $value (not (regexMatch "^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $value)) }}
{{- fail (printf "%s[%d].value: %q is not a label value (at most 63 letters, digits, - _ .)" $name $i $value) }}
{{- end }}
{{- if and (not (kindIs "invalid" $t.tolerationSeconds)) (ne ($t.effect | default "") "NoExecute") }}
{{- fail (printf "%s[%d].tolerationSeconds: only applies with effect NoExecute (effect is %q)" $name $i ($t.effect | default "")) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Fails unless each selector requirement (list of value name and list) keeps the API server's rules: In and
NotIn need values, Exists and DoesNotExist take none, Gt and Lt (node selectors only) one integer.
*/}}
{{- define "trainer.requireSelectorRequirements" -}}
{{- $name := index . 0 }}
{{- range $i, $r := index . 1 }}
{{- $values := $r.values | default list }}
{{- if and (has $r.operator (list "In" "NotIn")) (not $values) }}
{{- fail (printf "%s[%d].values: operator %s needs at least one value" $name $i $r.operator) }}
{{- end }}
{{- if and (has $r.operator (list "Exists" "DoesNotExist")) $values }}
{{- fail (printf "%s[%d].values: must be empty with operator %s" $name $i $r.operator) }}
{{- end }}
{{- if and (has $r.operator (list "Gt" "Lt")) (or (ne (len $values) 1) (not (regexMatch "^-?[0-9]+$" (toString (first $values))))) }}
{{- fail (printf "%s[%d].values: operator %s needs exactly one integer value" $name $i $r.operator) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Every selector requirement of the affinity value (see trainer.requireSelectorRequirements). */}}
{{- define "trainer.requireAffinity" -}}
{{- $affinity := . | default dict }}
{{- $node := $affinity.nodeAffinity | default dict }}
{{- with $node.requiredDuringSchedulingIgnoredDuringExecution }}
{{- range $i, $term := .nodeSelectorTerms }}
{{- $at := printf "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[%d]" $i }}
{{- include "trainer.requireSelectorRequirements" (list (printf "%s.matchExpressions" $at) ($term.matchExpressions | default list)) }}
{{- include "trainer.requireSelectorRequirements" (list (printf "%s.matchFields" $at) ($term.matchFields | default list)) }}
{{- end }}
{{- end }}
{{- range $i, $p := $node.preferredDuringSchedulingIgnoredDuringExecution | default list }}
{{- $at := printf "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[%d].preference" $i }}
{{- include "trainer.requireSelectorRequirements" (list (printf "%s.matchExpressions" $at) ($p.preference.matchExpressions | default list)) }}
{{- end }}
{{- range $kind := list "podAffinity" "podAntiAffinity" }}
{{- $pod := get $affinity $kind | default dict }}
{{- range $i, $term := $pod.requiredDuringSchedulingIgnoredDuringExecution | default list }}
{{- $at := printf "affinity.%s.requiredDuringSchedulingIgnoredDuringExecution[%d]" $kind $i }}
{{- range $sel := list "labelSelector" "namespaceSelector" }}
{{- $selector := get $term $sel | default dict }}
{{- include "trainer.requireSelectorRequirements" (list (printf "%s.%s.matchExpressions" $at $sel) ($selector.matchExpressions | default list)) }}
{{- end }}
{{- end }}
{{- range $i, $w := $pod.preferredDuringSchedulingIgnoredDuringExecution | default list }}
{{- $at := printf "affinity.%s.preferredDuringSchedulingIgnoredDuringExecution[%d].podAffinityTerm" $kind $i }}
{{- range $sel := list "labelSelector" "namespaceSelector" }}
{{- $selector := get $w.podAffinityTerm $sel | default dict }}
{{- include "trainer.requireSelectorRequirements" (list (printf "%s.%s.matchExpressions" $at $sel) ($selector.matchExpressions | default list)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainer.validate" -}}
{{- $v := .Values }}
{{- $qualifiedName := "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" }}
{{- $keyKind := "a Kubernetes qualified name ([prefix/]name, name at most 63 letters, digits, - _ .)" }}
{{- include "trainer.requireKeys" (list "nodeSelector" $v.nodeSelector $qualifiedName $keyKind) }}
{{- include "trainer.requireKeys" (list "podLabels" $v.podLabels $qualifiedName $keyKind) }}
{{- include "trainer.requireKeys" (list "podAnnotations" $v.podAnnotations $qualifiedName $keyKind) }}
{{- include "trainer.requireKeys" (list "podMonitor.labels" (default dict $v.podMonitor.labels) $qualifiedName $keyKind) }}
{{- include "trainer.requireKeys" (list "rendezvous.nodeSelector" $v.rendezvous.nodeSelector $qualifiedName $keyKind) }}
{{- range $sel := list "metricsNamespaceSelector" "metricsPodSelector" }}
{{- $selector := get $v.networkPolicy $sel | default dict }}
{{- include "trainer.requireKeys" (list (printf "networkPolicy.%s.matchLabels" $sel) ($selector.matchLabels | default dict) $qualifiedName $keyKind) }}
{{- include "trainer.requireSelectorRequirements" (list (printf "networkPolicy.%s.matchExpressions" $sel) ($selector.matchExpressions | default list)) }}
{{- end }}
{{- include "trainer.requireTolerations" (list "tolerations" $v.tolerations $qualifiedName) }}
{{- include "trainer.requireTolerations" (list "rendezvous.tolerations" $v.rendezvous.tolerations $qualifiedName) }}
{{- include "trainer.requireAffinity" $v.affinity }}
{{- /* The API server's cap on a pod's annotations (keys and values together, the chart's own included). */}}
{{- $annotationBytes := 0 }}
{{- range $key, $value := merge (dict) $v.podAnnotations (include "trainer.chartPodAnnotations" . | fromYaml | default dict) }}
{{- $annotationBytes = add $annotationBytes (len $key) (len (toString $value)) }}
{{- end }}
{{- if gt $annotationBytes 262144 }}
{{- fail (printf "podAnnotations: %d bytes of annotations (keys and values, with the chart's own) is more than the API server's 256 KiB" $annotationBytes) }}
{{- end }}
{{- /* Kubernetes reserves system- priority classes for cluster components (system-node-critical and
     system-cluster-critical pods are admitted in kube-system only); a trainer there would preempt them. */}}
{{- if and (hasPrefix "system-" $v.priorityClassName) (ne .Release.Namespace "kube-system") }}
{{- fail (printf "priorityClassName: %q is a system priority class, reserved for cluster components in kube-system (the release is in %s); create a priority class of your own" $v.priorityClassName .Release.Namespace) }}
{{- end }}
{{- include "trainer.requireKeys" (list "extraEnv" $v.extraEnv "^[A-Za-z_][A-Za-z0-9_]*$" "an environment variable name (letters, digits, _; not starting with a digit)") }}
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
{{- /* null: the trainer's own default (min(10 s, inprocessHardTimeout), trainer/resilience/timeouts.py),
     checked by the check-config init container. */}}
{{- if not (kindIs "invalid" $v.inprocessLivenessTimeout) }}
{{- if gt (float64 $v.inprocessLivenessTimeout) (float64 $v.inprocessHardTimeout) }}
{{- fail (printf "timeouts must nest: inprocessLivenessTimeout (%v s) must not exceed inprocessHardTimeout (%v s); see values.yaml" $v.inprocessLivenessTimeout $v.inprocessHardTimeout) }}
{{- end }}
{{- if le (float64 $v.inprocessLivenessTimeout) 1.0 }}
{{- fail (printf "inprocessLivenessTimeout (%v s) must exceed the Wrapper's 1 s heartbeat interval" $v.inprocessLivenessTimeout) }}
{{- end }}
{{- end }}
{{- include "trainer.requireIncreasing" (list
      (list "ftWorkloadCheckInterval" $v.ftWorkloadCheckInterval)
      (list "ftRankHeartbeatTimeout" $v.ftRankHeartbeatTimeout)) }}
{{- include "trainer.requireIncreasing" (list
      (list "monitorInterval" $v.monitorInterval)
      (list "ftRankHeartbeatTimeout" $v.ftRankHeartbeatTimeout)) }}
{{- /* The calculated hang timeout (trainer/resilience/hangtimeout.py) acts only after a lost node was
     noticed (liveness) and is checked at least once before it runs out. */}}
{{- if not (kindIs "invalid" $v.inprocessLivenessTimeout) }}
{{- include "trainer.requireIncreasing" (list
      (list "inprocessLivenessTimeout" $v.inprocessLivenessTimeout)
      (list "hangTimeoutFloor" $v.hangTimeoutFloor)) }}
{{- end }}
{{- include "trainer.requireIncreasing" (list
      (list "ftWorkloadCheckInterval" $v.ftWorkloadCheckInterval)
      (list "hangTimeoutFloor" $v.hangTimeoutFloor)) }}
{{- $previous := 0 }}
{{- range $v.failJobExitCodes }}
{{- if le (int .) $previous }}
{{- fail (printf "failJobExitCodes must be in increasing order without repeats (Kubernetes requires it); got %v" $v.failJobExitCodes) }}
{{- end }}
{{- $previous = int . }}
{{- end }}
{{- /* What the instance type has (instance-types.json, the table infra uses too). */}}
{{- $facts := include "trainer.instanceFacts" . | fromJson }}
{{- if gt (int $v.gpusPerNode) (int $facts.gpus) }}
{{- fail (printf "gpusPerNode: %d is more than instanceType %s has (%d GPUs)" (int $v.gpusPerNode) $v.instanceType (int $facts.gpus)) }}
{{- end }}
{{- if and (not (kindIs "invalid" $v.efaPerNode)) (gt (int $v.efaPerNode) (int $facts.efaInterfaces)) }}
{{- fail (printf "efaPerNode: %d is more than instanceType %s has (%d EFA interfaces)" (int $v.efaPerNode) $v.instanceType (int $facts.efaInterfaces)) }}
{{- end }}
{{- /* Rank 0's pod listens on the rendezvous port (MASTER_PORT: torch elastic's c10d backend hands its
     store's port to the workers) and the trainer's stores at MASTER_PORT+1 and +2 (docs/design.md). */}}
{{- $rdzv := int $v.rdzvPort }}
{{- if gt $rdzv 65533 }}
{{- fail (printf "rdzvPort: %d leaves no room for the trainer's stores at rdzvPort+1 and +2 (at most 65533)" $rdzv) }}
{{- end }}
{{- $metrics := int $v.metricsPort }}
{{- if and (gt $metrics 0) (le $rdzv $metrics) (le $metrics (add $rdzv 2 | int)) }}
{{- fail (printf "metricsPort: %d is taken by the rendezvous store (rdzvPort %d) or the trainer's stores (rdzvPort+1, +2)" $metrics $rdzv) }}
{{- end }}
{{- /* Sizes of memory parsed as Kubernetes does (trainer.quantityValue): a suffix m is milli, so 512m
     is half a byte, and a 0 shmSize leaves NCCL and the snapshots no /dev/shm. Under 1Mi is no one's
     intent; refused here instead of at the trainer's start or as an OOM kill. */}}
{{- $memories := list (list "memoryRequest" $v.memoryRequest) (list "shmSize" $v.shmSize) (list "scratchSize" $v.scratchSize)
      (list "helperResources.requests.memory" $v.helperResources.requests.memory)
      (list "helperResources.limits.memory" $v.helperResources.limits.memory) }}
{{- if $v.memoryLimit }}{{ $memories = append $memories (list "memoryLimit" $v.memoryLimit) }}{{ end }}
{{- if $v.hugepages2Mi }}{{ $memories = append $memories (list "hugepages2Mi" $v.hugepages2Mi) }}{{ end }}
{{- range $memories }}
{{- $bytes := include "trainer.quantityValue" . | float64 }}
{{- if lt $bytes 1048576.0 }}
{{- fail (printf "%s: %q is %v bytes, under 1Mi (the suffix m is milli: 512m is half a byte; write Mi or Gi)" (index . 0) (index . 1) $bytes) }}
{{- end }}
{{- end }}
{{- range (list (list "cpuRequest" $v.cpuRequest) (list "helperResources.requests.cpu" $v.helperResources.requests.cpu) (list "helperResources.limits.cpu" $v.helperResources.limits.cpu)) }}
{{- if not (gt (include "trainer.quantityValue" . | float64) 0.0) }}
{{- fail (printf "%s: %q is no CPU; give at least 1m" (index . 0) (index . 1)) }}
{{- end }}
{{- end }}
{{- if $v.memoryLimit }}
{{- $request := include "trainer.quantityValue" (list "memoryRequest" $v.memoryRequest) | float64 }}
{{- $limit := include "trainer.quantityValue" (list "memoryLimit" $v.memoryLimit) | float64 }}
{{- if lt $limit $request }}
{{- fail (printf "memoryLimit: %s is below memoryRequest (%s)" $v.memoryLimit $v.memoryRequest) }}
{{- end }}
{{- $shm := include "trainer.quantityValue" (list "shmSize" $v.shmSize) | float64 }}
{{- if gt $shm $limit }}
{{- fail (printf "shmSize: %s is above memoryLimit (%s); /dev/shm is memory and counts against the limit" $v.shmSize $v.memoryLimit) }}
{{- end }}
{{- end }}
{{- /* A request above its limit: the API server refuses the pod (or the Deployment's pods, later, with no
     word to helm); refused here naming the pair. */}}
{{- range $name, $res := dict "rendezvous.resources" $v.rendezvous.resources "helperResources" $v.helperResources }}
{{- range $kind := list "cpu" "memory" }}
{{- $request := index ($res.requests | default dict) $kind }}
{{- $limit := index ($res.limits | default dict) $kind }}
{{- if and $request $limit }}
{{- if gt (include "trainer.quantityValue" (list (printf "%s.requests.%s" $name $kind) $request) | float64) (include "trainer.quantityValue" (list (printf "%s.limits.%s" $name $kind) $limit) | float64) }}
{{- fail (printf "%s.requests.%s: %v is above %s.limits.%s (%v); Kubernetes refuses a request above its limit" $name $kind $request $name $kind $limit) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- /* The Service and the pods' subdomain need a DNS-1035 label; pod hostnames <name>-<index> a label. */}}
{{- $fullname := include "trainer.fullname" . }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) }}
{{- fail (printf "nameOverride/fullnameOverride/release name: the resource name %q is not a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)" $fullname) }}
{{- end }}
{{- /* extraEnv must not replace what the pod command or the launcher relies on. */}}
{{- $reserved := dict
      "NNODES" "set by the chart from nodes" "NPROC_PER_NODE" "set by the chart from gpusPerNode"
      "RDZV_ENDPOINT" "set by the chart (pod 0, rdzvPort)" "JOB_ID" "set by the chart (the release's full name)"
      "DATA_PATH" "set by the chart from dataPath" "CHECKPOINT_DIR" "set by the chart from storage.mountPath and runName"
      "LOCAL_CHECKPOINT_DIR" "set by the chart from runName" "OUT_DIR" "set by the chart from storage.mountPath and runName"
      "NCCL_DEBUG" "set it with ncclDebug" "NCCL_SOCKET_IFNAME" "set it with ncclSocketIfname"
      "PYTHONUNBUFFERED" "set by the chart" "FI_PROVIDER" "set by the chart from efaPerNode"
      "FI_EFA_USE_DEVICE_RDMA" "set by the chart from efaPerNode" "FI_EFA_USE_HUGE_PAGE" "set by the chart from hugepages2Mi"
      "RDMAV_FORK_SAFE" "set by the chart" "HOME" "set by the chart: /tmp, the scratch volume"
      "TRAINER_FAULTS" "set faults instead (checked here)" "TRAINER_STORE_HOST" "the trainer's stores follow MASTER_ADDR"
      "TRAINER_PG_PORT" "the chart's port checks assume rdzvPort+1" "TRAINER_INPROCESS_PORT" "the chart's port checks assume rdzvPort+2"
      "MASTER_ADDR" "set by ft_launcher for each worker" "MASTER_PORT" "set by ft_launcher for each worker"
      "RANK" "set by ft_launcher for each worker" "LOCAL_RANK" "set by ft_launcher for each worker"
      "WORLD_SIZE" "set by ft_launcher for each worker" "LOCAL_WORLD_SIZE" "set by ft_launcher for each worker"
      "GROUP_RANK" "set by ft_launcher for each worker" "JOB_COMPLETION_INDEX" "set by Kubernetes for each pod" }}
{{- range $name := keys $v.extraEnv | sortAlpha }}
{{- if hasKey $reserved $name }}
{{- fail (printf "extraEnv.%s: the pod command depends on it (%s)" $name (get $reserved $name)) }}
{{- end }}
{{- if hasPrefix "TORCHELASTIC_" $name }}
{{- fail (printf "extraEnv.%s: the pod command depends on it (set by ft_launcher for each worker)" $name) }}
{{- end }}
{{- end }}
{{- include "trainer.requireDistinctMounts" (list
      (list "storage.mountPath" $v.storage.mountPath)
      (list "the NVMe tier" (include "trainer.localNvmeMount" .))
      (list "/dev/shm" "/dev/shm")
      (list "the scratch volume" "/tmp")) }}
{{- include "trainer.requireReachableFaults" . }}
{{- $maxSeqLen := include "trainer.maxSeqLen" . | int }}
{{- if gt (int $v.seqLen) $maxSeqLen }}
{{- fail (printf "seqLen: %d is more than preset %s supports (%d)" (int $v.seqLen) $v.preset $maxSeqLen) }}
{{- end }}
{{- if and (eq $v.workload "jobset") (not ($.Capabilities.APIVersions.Has "jobset.x-k8s.io/v1alpha2")) }}
{{- fail "workload=jobset needs the JobSet controller (API jobset.x-k8s.io/v1alpha2) in the cluster; install it or use workload=job" }}
{{- end }}
{{- end }}
