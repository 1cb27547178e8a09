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

{{/* Fails unless every key of the map (list of value name and map) matches the pattern (list of regex and what it is). */}}
{{- define "trainer.requireKeys" -}}
{{- $name := index . 0 }}
{{- range $key, $_ := index . 1 }}
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

{{- define "trainer.validate" -}}
{{- $v := .Values }}
{{- $qualifiedName := "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" }}
{{- $keyKind := "a Kubernetes qualified name ([prefix/]name, name at most 63 letters, digits, - _ .)" }}
{{- include "trainer.requireKeys" (list "nodeSelector" $v.nodeSelector $qualifiedName $keyKind) }}
{{- include "trainer.requireKeys" (list "podLabels" $v.podLabels $qualifiedName $keyKind) }}
{{- include "trainer.requireKeys" (list "podAnnotations" $v.podAnnotations $qualifiedName $keyKind) }}
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
{{- /* The calculated hang timeout (trainer/resilience/hangtimeout.py) acts only after a lost node was
     noticed (liveness) and is checked at least once before it runs out. */}}
{{- include "trainer.requireIncreasing" (list
      (list "inprocessLivenessTimeout" $v.inprocessLivenessTimeout)
      (list "hangTimeoutFloor" $v.hangTimeoutFloor)) }}
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
