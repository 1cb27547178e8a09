{{/*
The trainer pod (template metadata and spec), shared by the Job and the JobSet workloads. The container
runs Contract 2 of docs/design.md: ft_launcher in exec form with `$(VAR)` references to its own env, so
the local demo can run the very same argv after swapping the env entries that name cluster places.
*/}}

{{/*
The rendezvous options the launchers and the rendezvous service share (--rdzv-conf). No `is_host`: the
endpoint names the rendezvous service's Service, which no launcher's host name matches, so every launcher
is a client (a local harness, where every endpoint is 127.0.0.1, adds is_host=0 itself: tools/localjob.py).
*/}}
{{- define "trainer.rdzvConf" -}}
--rdzv-conf=join_timeout={{ int .Values.rdzvJoinTimeout }},last_call_timeout={{ int .Values.rdzvLastCallTimeout }}
{{- end }}

{{/*
The rendezvous service's arguments (templates/rendezvous.yaml): NVRx's nvrx-control options, the
launchers' own node range, id and --rdzv-conf; it listens on rdzvPort (the endpoint's host is only where
its own client connects: itself). tools/podcommand.py rendezvous_argv derives the same from a pod command.
*/}}
{{- define "trainer.rendezvousArgs" -}}
{{- $v := .Values -}}
- --nnodes={{ int $v.nodes }}:{{ add (int $v.nodes) (int $v.spareNodes) }}
- --rdzv-backend=c10d
- --rdzv-endpoint=127.0.0.1:{{ int $v.rdzvPort }}
- --rdzv-id={{ include "trainer.fullname" . }}
- {{ include "trainer.rdzvConf" . }}
- --ft-enable-log-server=false
{{- end }}

{{/* ft_launcher's arguments, then `-m trainer` and the trainer's. */}}
{{- define "trainer.args" -}}
{{- $v := .Values -}}
- --nnodes=$(NNODES):$(MAX_NNODES)
- --nproc-per-node=$(NPROC_PER_NODE)
- --rdzv-backend=c10d
- --rdzv-endpoint=$(RDZV_ENDPOINT)
- --rdzv-id=$(JOB_ID)
- --ft-rdzv-impl=barrier
- {{ include "trainer.rdzvConf" . }}
- --max-restarts={{ int $v.maxRestarts }}
- {{ printf "--monitor-interval=%v" $v.monitorInterval | quote }}
- --workers-stop-timeout={{ int $v.workersStopTimeout }}
- --term-timeout={{ max 1 (sub (int $v.terminationGracePeriodSeconds) 10) }}
- --ft-restart-policy=any-failed
- {{ printf "--ft-rank-heartbeat-timeout=%v" $v.ftRankHeartbeatTimeout | quote }}
- {{ printf "--ft-initial-rank-heartbeat-timeout=%v" $v.ftInitialRankHeartbeatTimeout | quote }}
- {{ printf "--ft-workload-check-interval=%v" $v.ftWorkloadCheckInterval | quote }}
{{- /* NVRx's "do not restart" verdict (no progress across restarts) exits with 93, which
     failJobExitCodes turns into FailJob; the trainer writes the iteration file at every commit. */}}
- --ft-no-restart-exit-code=93
- --ft-max-no-progress-cycles={{ int $v.maxNoProgressCycles }}
- --ft-checkpoint-iteration-file=$(CHECKPOINT_DIR)/latest_checkpointed_iteration.txt
{{ include "trainer.nodeHealthLauncherArgs" . }}
- -m
- trainer
{{ include "trainer.trainerArgs" . }}
{{- with include "trainer.entryArgs" . }}
{{ . }}
{{- end }}
{{- end }}

{{/*
ft_launcher's node health options (docs/operations.md, "Node health"): before it joins each rendezvous
round, the launcher asks the pod's node-health sidecar (trainer.nodeHealthContainer) over its Unix socket,
and runs NVRx's own Lustre/NFS mount check; a node that fails is refused and a spare joins instead. NVRx
records each restart cycle under the run's output directory.
*/}}
{{- define "trainer.nodeHealthLauncherArgs" -}}
{{- $v := .Values -}}
- --ft-cycle-info-dir=$(OUT_DIR)/nvrx-cycles
{{- if $v.nodeHealth }}
- --ft-node-health-check-endpoint={{ include "trainer.nodeHealthSocket" . }}
- --ft-enable-dist-storage-healthcheck=true
{{- if $v.nodeHealthPathCheck }}
- {{ printf "--ft-storage-health-check-path=%s" $v.storage.mountPath | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainer.nodeHealthSocketDir" -}}/run/trainer-health{{- end }}
{{- define "trainer.nodeHealthSocket" -}}{{ include "trainer.nodeHealthSocketDir" . }}/health.sock{{- end }}

{{/*
The node health daemon (python -m trainer.health) as a native sidecar: an init container with
restartPolicy Always, started after the other init containers and before the trainer, which the kubelet
starts only once the startup probe finds the socket (NVRx's launcher looks for it once, when it starts,
and skips the check for good if it is missing), and stops after the trainer ends (a Job's pod still
completes). Its socket lives in an emptyDir only this pod mounts (docs/security.md). The GPUs and EFA
devices belong to the trainer container; the daemon sees the GPUs through the NVIDIA runtime
(NVIDIA_VISIBLE_DEVICES=all, utility only) where the cluster allows it, and skips each device check with
its reason where it sees no device.
*/}}
{{- define "trainer.nodeHealthContainer" -}}
{{- $v := .Values -}}
- name: node-health
  image: {{ include "trainer.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy | quote }}
  restartPolicy: Always
  command: [python, -m, trainer.health]
  args:
    - --socket={{ include "trainer.nodeHealthSocket" . }}
    - --storage-path=$(OUT_DIR)
    - {{ printf "--storage-deadline=%v" $v.nodeHealthStorageDeadline | quote }}
    - {{ printf "--nvme-path=%s" (include "trainer.localNvmeMount" .) | quote }}
    - {{ printf "--nvme-min-free-gib=%v" $v.nodeHealthNvmeMinFreeGiB | quote }}
    - --gpus={{ int $v.gpusPerNode }}
    - --efa-devices={{ include "trainer.efaPerNode" . | int }}
  env:
    - name: OUT_DIR
      value: {{ printf "%s/runs/%s" (trimSuffix "/" $v.storage.mountPath) (include "trainer.runName" .) | quote }}
    - name: HOME
      value: /tmp
    - name: PYTHONUNBUFFERED
      value: "1"
    {{- if ne $v.device "cpu" }}
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
  startupProbe:
    exec:
      command: [python, -m, trainer.health, probe, --socket, {{ include "trainer.nodeHealthSocket" . }}]
    periodSeconds: 1
    failureThreshold: 120
  resources:
    {{- include "trainer.helperResources" . | nindent 4 }}
  securityContext:
    {{- include "trainer.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - name: fsx
      mountPath: {{ $v.storage.mountPath | quote }}
    - name: local-nvme
      mountPath: {{ include "trainer.localNvmeMount" . | quote }}
      readOnly: true
    - name: node-health
      mountPath: {{ include "trainer.nodeHealthSocketDir" . }}
    {{- include "trainer.scratchMount" . | nindent 4 }}
{{- end }}

{{/*
The trainer's own arguments (after `-m trainer`); the check-config init container reuses them. The
settings' options are generated (templates/_trainer_args.tpl, tools/chartgen.py); extraTrainerArgs last.
*/}}
{{- define "trainer.trainerArgs" -}}
{{ include "trainer.settingArgs" . }}
{{- /* `$` doubled, as for entrypointArgs: each argument reaches the trainer exactly as written. */}}
{{- range .Values.extraTrainerArgs }}
- {{ replace "$" "$$" . | quote }}
{{- end }}
{{- end }}

{{/*
The entry point's own arguments (docs/design.md, "The entry point"), always after every trainer option
(the trainer takes everything after the first `--` as the entry point's): `--`, the reference model's
options when the entry point is the reference (trainer/reference/config.py), then one quoted exec-form
argument per entrypointArgs item; nothing when there are none. Every `$` of entrypointArgs is doubled:
the kubelet expands `$(VAR)` in args and reads `$$` as `$`, so each reaches the process exactly as written.
*/}}
{{- define "trainer.entryArgs" -}}
{{- $v := .Values -}}
{{- $reference := has $v.entrypoint (list "trainer.reference:train" "trainer.reference") -}}
{{- if or $reference $v.entrypointArgs -}}
- "--"
{{- if $reference }}
{{ include "trainer.referenceArgs" . }}
{{- end }}
{{- range $v.entrypointArgs }}
- {{ replace "$" "$$" . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The trainer's env: plain values only (no downward API), so the demo can take them as they are. The
first eight are the places Contract 2 names; the rest configure NCCL and EFA.
*/}}
{{- define "trainer.env" -}}
{{ include "trainer.chartEnv" . }}
{{- /* `$` doubled: the kubelet expands $(VAR) in env values too, and reads $$ as $. */}}
{{- range $name := keys .Values.extraEnv | sortAlpha }}
- name: {{ $name | quote }}
  value: {{ get $.Values.extraEnv $name | replace "$" "$$" | quote }}
{{- end }}
{{- end }}

{{/* The env the chart itself sets (trainer.reservedNames derives the reserved names from it). */}}
{{- define "trainer.chartEnv" -}}
{{- $v := .Values }}
{{- $run := include "trainer.runName" . }}
{{- $efa := include "trainer.efaPerNode" . | int -}}
- name: NNODES
  value: {{ int $v.nodes | quote }}
- name: MAX_NNODES
  value: {{ add (int $v.nodes) (int $v.spareNodes) | quote }}
- name: NPROC_PER_NODE
  value: {{ int $v.gpusPerNode | quote }}
- name: RDZV_ENDPOINT
  value: {{ printf "%s:%d" (include "trainer.rdzvHost" .) (int $v.rdzvPort) | quote }}
- name: JOB_ID
  value: {{ include "trainer.fullname" . | quote }}
- name: DATA_PATH
  value: {{ $v.dataPath | quote }}
- name: CHECKPOINT_DIR
  value: {{ printf "%s/checkpoints/%s" (trimSuffix "/" $v.storage.mountPath) $run | quote }}
- name: LOCAL_CHECKPOINT_DIR
  value: {{ printf "%s/checkpoints/%s" (include "trainer.localNvmeMount" .) $run | quote }}
- name: OUT_DIR
  value: {{ printf "%s/runs/%s" (trimSuffix "/" $v.storage.mountPath) $run | quote }}
- name: PYTHONUNBUFFERED
  value: "1"
- name: NCCL_DEBUG
  value: {{ $v.ncclDebug | quote }}
- name: NCCL_SOCKET_IFNAME
  value: {{ $v.ncclSocketIfname | quote }}
{{- if gt $efa 0 }}
{{- /* libfabric's EFA provider with GPUDirect RDMA (p4d, p5, p5e and p5en all support it). */}}
- name: FI_PROVIDER
  value: efa
- name: FI_EFA_USE_DEVICE_RDMA
  value: "1"
{{- if not $v.hugepages2Mi }}
- name: FI_EFA_USE_HUGE_PAGE
  value: "0"
{{- end }}
{{- end }}
{{- /* ibverbs memory registration stays correct across fork() (data loader workers, ft_launcher). */}}
- name: RDMAV_FORK_SAFE
  value: "1"
{{- /* The root filesystem is read-only: HOME and every cache under it live on the /tmp scratch volume. */}}
- name: HOME
  value: /tmp
{{- end }}

{{/* Requests and limits: GPUs, EFA devices and huge pages are extended resources (limits = requests). */}}
{{- define "trainer.resources" -}}
{{- $v := .Values }}
{{- $efa := include "trainer.efaPerNode" . | int -}}
requests:
  cpu: {{ $v.cpuRequest | quote }}
  memory: {{ $v.memoryRequest | quote }}
  nvidia.com/gpu: {{ int $v.gpusPerNode }}
  {{- if gt $efa 0 }}
  vpc.amazonaws.com/efa: {{ $efa }}
  {{- end }}
  {{- if $v.hugepages2Mi }}
  hugepages-2Mi: {{ $v.hugepages2Mi | quote }}
  {{- end }}
limits:
  nvidia.com/gpu: {{ int $v.gpusPerNode }}
  {{- if gt $efa 0 }}
  vpc.amazonaws.com/efa: {{ $efa }}
  {{- end }}
  {{- if $v.hugepages2Mi }}
  hugepages-2Mi: {{ $v.hugepages2Mi | quote }}
  {{- end }}
  {{- if $v.memoryLimit }}
  memory: {{ $v.memoryLimit | quote }}
  {{- end }}
{{- end }}

{{/* The container security context: see runAsNonRoot in values.yaml for why root is the default. */}}
{{- define "trainer.containerSecurityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  add: [IPC_LOCK]
seccompProfile:
  type: RuntimeDefault
{{- if .Values.runAsNonRoot }}
runAsNonRoot: true
runAsUser: {{ int .Values.runAsUser }}
runAsGroup: {{ int .Values.runAsGroup }}
{{- end }}
{{- end }}

{{/* The pod annotations the chart sets (Prometheus scraping); podAnnotations may not repeat them. */}}
{{- define "trainer.chartPodAnnotations" -}}
{{- $v := .Values }}
{{- if and $v.metricsScrapeAnnotations (gt (int $v.metricsPort) 0) }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ int $v.metricsPort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* The pod template: metadata and spec. `subdomain` gives the pods DNS names under the Service. */}}
{{- define "trainer.podTemplate" -}}
{{- $v := .Values }}
{{- $fullname := include "trainer.fullname" . -}}
{{- $_ := include "trainer.validateInputs" . -}}
metadata:
  labels:
    {{- include "trainer.podLabels" . | nindent 4 }}
  {{- $chartAnnotations := include "trainer.chartPodAnnotations" . | trim }}
  {{- if or $v.podAnnotations $chartAnnotations }}
  annotations:
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with $chartAnnotations }}
    {{- . | nindent 4 }}
    {{- end }}
  {{- end }}
spec:
  restartPolicy: Never
  {{- if eq $v.workload "job" }}
  subdomain: {{ $fullname | quote }}
  {{- end }}
  serviceAccountName: {{ $v.serviceAccountName | quote }}
  {{- /* The trainer talks to its peers and FSx, never to the Kubernetes API. */}}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {{ int $v.terminationGracePeriodSeconds }}
  {{- with $v.priorityClassName }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- with $v.schedulerName }}
  schedulerName: {{ . | quote }}
  {{- end }}
  securityContext:
    {{- include "trainer.podSecurityContext" . | nindent 4 }}
  nodeSelector:
    {{- include "trainer.nodeSelector" . | nindent 4 }}
  tolerations:
    {{- include "trainer.tolerations" . | nindent 4 }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  initContainers:
  {{- if $v.runAsNonRoot }}
    {{- include "trainer.prepareDirsContainer" . | nindent 4 }}
  {{- end }}
  {{- if gt (int $v.syntheticTokens) 0 }}
    {{- /* Pod 0 writes the token file under a temporary name and renames it (atomic on Lustre), so
         the others never map a half-written file; they wait for the name to appear. */}}
    - name: synthetic-data
      image: {{ include "trainer.image" . | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy | quote }}
      command: [sh, -c]
      args:
        - |
          set -eu
          [ -f "$DATA_PATH" ] && exit 0
          if [ "${JOB_COMPLETION_INDEX:-0}" = 0 ]; then
            mkdir -p "$(dirname "$DATA_PATH")"
            tmp="${DATA_PATH%.npy}.partial-$(hostname).npy"
            python -m trainer.reference.data --out "$tmp" --tokens {{ int64 $v.syntheticTokens }} --vocab {{ include "trainer.vocabSize" . }} --seed {{ int $v.seed }}
            mv "$tmp.meta.json" "$DATA_PATH.meta.json"  # its recorded max id: start-up checks skip a full scan
            mv "$tmp" "$DATA_PATH"
          else
            waited=0
            until [ -f "$DATA_PATH" ]; do
              [ "$waited" -lt 900 ] || { echo "no $DATA_PATH after 900 s" >&2; exit 1; }
              sleep 2; waited=$((waited + 2))
            done
          fi
      env:
        - name: DATA_PATH
          value: {{ $v.dataPath | quote }}
      resources:
        {{- include "trainer.helperResources" . | nindent 8 }}
      securityContext:
        {{- include "trainer.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - name: fsx
          mountPath: {{ $v.storage.mountPath | quote }}
        {{- include "trainer.scratchMount" . | nindent 8 }}
  {{- end }}
    {{- /* ft_launcher hides a worker's exit code (it retries, then exits 1), so a configuration that
         no restart can fix is caught here, where exit code 2 reaches the Job's FailJob rule. */}}
    - name: check-config
      image: {{ include "trainer.image" . | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy | quote }}
      command: [python, -m, trainer]
      args:
        {{- include "trainer.trainerArgs" . | nindent 8 }}
        - --check-config
        {{- with include "trainer.entryArgs" . }}
        {{- . | nindent 8 }}
        {{- end }}
      env:
        {{- include "trainer.env" . | nindent 8 }}
      {{- /* The same devices as the trainer (it checks that the GPUs it asks for are visible); an init
           container's requests are not added to the pod's, the larger of the two counts. */}}
      resources:
        {{- include "trainer.resources" . | nindent 8 }}
      securityContext:
        {{- include "trainer.containerSecurityContext" . | nindent 8 }}
      {{- /* The trainer's mounts: the check writes a probe file in each checkpoint and output dir. */}}
      volumeMounts:
        - name: fsx
          mountPath: {{ $v.storage.mountPath | quote }}
        - name: local-nvme
          mountPath: {{ include "trainer.localNvmeMount" . | quote }}
        {{- include "trainer.scratchMount" . | nindent 8 }}
  {{- if $v.nodeHealth }}
    {{- include "trainer.nodeHealthContainer" . | nindent 4 }}
  {{- end }}
  containers:
    - name: trainer
      image: {{ include "trainer.image" . | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy | quote }}
      {{- /* Contract 2: with preforkWorkers, trainer.launcher starts the pod's zygote and execs ft_launcher. */}}
      {{- if $v.preforkWorkers }}
      command: [python, -m, trainer.launcher]
      args:
        - ft_launcher
        {{- include "trainer.args" . | nindent 8 }}
      {{- else }}
      command: [ft_launcher]
      args:
        {{- include "trainer.args" . | nindent 8 }}
      {{- end }}
      env:
        {{- include "trainer.env" . | nindent 8 }}
        {{- include "trainer.keyEnv" . | nindent 8 }}
      ports:
        - name: rdzv
          containerPort: {{ int $v.rdzvPort }}
        {{- if gt (int $v.metricsPort) 0 }}
        - name: metrics
          containerPort: {{ int $v.metricsPort }}
        {{- end }}
      resources:
        {{- include "trainer.resources" . | nindent 8 }}
      securityContext:
        {{- include "trainer.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - name: fsx
          mountPath: {{ $v.storage.mountPath | quote }}
        - name: local-nvme
          mountPath: {{ include "trainer.localNvmeMount" . | quote }}
        - name: dshm
          mountPath: /dev/shm
        {{- include "trainer.keyMounts" . | nindent 8 }}
        {{- include "trainer.scratchMount" . | nindent 8 }}
        {{- if $v.nodeHealth }}
        - name: node-health
          mountPath: {{ include "trainer.nodeHealthSocketDir" . }}
        {{- end }}
  volumes:
    - name: fsx
      persistentVolumeClaim:
        claimName: {{ $v.storage.claimName | quote }}
    - name: local-nvme
      hostPath:
        path: {{ $v.storage.localNvmePath | quote }}
        type: Directory
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $v.shmSize | quote }}
    {{- include "trainer.keyVolumes" . | nindent 4 }}
    {{- include "trainer.scratchVolume" . | nindent 4 }}
    {{- if $v.nodeHealth }}
    - name: node-health
      emptyDir:
        medium: Memory
        sizeLimit: 1Mi
    {{- end }}
{{- end }}

{{/* Pod failure handling shared by the Job and the JobSet's Job (see podRetriesPerIndex in values). */}}
{{- define "trainer.jobFailureSpec" -}}
{{- $v := .Values -}}
completionMode: Indexed
completions: {{ add (int $v.nodes) (int $v.spareNodes) }}
parallelism: {{ add (int $v.nodes) (int $v.spareNodes) }}
{{- /* Losing pod 0 (the rendezvous store's host) makes every other pod exit 1, each counting against
its index: the default total therefore scales with the node count. */}}
backoffLimit: {{ include "trainer.podRetriesTotal" $v }}
backoffLimitPerIndex: {{ int $v.podRetriesPerIndex }}
{{- /* One index out of retries fails the run: training needs every node. */}}
maxFailedIndexes: 0
{{- /* A replacement waits until the old pod is gone: never two pods with one index and hostname. */}}
podReplacementPolicy: Failed
podFailurePolicy:
  rules:
    {{- /* Drains, evictions, preemption, node loss: replace the pod without counting it. */}}
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
          status: "True"
    {{- /* A straggler evicted into a hot spare (trainer/resilience/straggler.py EVICTED_EXIT): replaced,
    not counted, like a node loss. */}}
    - action: Ignore
      onExitCodes:
        containerName: trainer
        operator: In
        values:
          - 95
    {{- with $v.failJobExitCodes }}
    {{- /* No containerName: the rule covers the check-config init container too. */}}
    - action: FailJob
      onExitCodes:
        operator: In
        values:
          {{- range . }}
          - {{ int . }}
          {{- end }}
    {{- end }}
suspend: {{ $v.suspend | toJson }}
{{- with $v.activeDeadlineSeconds }}
activeDeadlineSeconds: {{ int . }}
{{- end }}
{{- if not (kindIs "invalid" $v.ttlSecondsAfterFinished) }}
ttlSecondsAfterFinished: {{ int $v.ttlSecondsAfterFinished }}
{{- end }}
{{- end }}

{{/* The two key files of docs/design.md Contract 5, read-only, never optional (a pod without its keys
     does not start). The env names only their paths. */}}
{{- define "trainer.keyEnv" -}}
- name: TRAINER_REPLICA_KEY_FILE
  value: /var/run/trainer/replica-key/replica.key
- name: TRAINER_CKPT_KEY_FILE
  value: /var/run/trainer/ckpt-key/checkpoint.key
{{- end }}

{{- define "trainer.keyMounts" -}}
- name: replica-key
  mountPath: /var/run/trainer/replica-key
  readOnly: true
- name: ckpt-key
  mountPath: /var/run/trainer/ckpt-key
  readOnly: true
{{- end }}

{{- define "trainer.keyVolumes" -}}
- name: replica-key
  secret:
    secretName: {{ printf "%s-replica-key" (include "trainer.fullname" .) | trunc 63 | trimSuffix "-" | quote }}
    defaultMode: 0440
    optional: false
- name: ckpt-key
  secret:
    secretName: {{ .Values.checkpointKey.secretName | quote }}
    defaultMode: 0440
    optional: false
{{- end }}
